"""The Wrapper store's generation names one rendezvous round the same way on every node
(agent/storehost.generation), whichever node's workers failed."""

from __future__ import annotations

import pytest

from trainguard.agent.executors import storehost


def _env(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for key in ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_without_the_shared_store_the_round_is_its_master_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torchrun after node A's workers failed: A counts a restart, B does not.
    _env(monkeypatch, TORCHELASTIC_USE_AGENT_STORE="False", TORCHELASTIC_RESTART_COUNT="1")
    monkeypatch.setenv("MASTER_PORT", "41234")
    on_a = storehost.generation()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    on_b = storehost.generation()
    assert on_a == on_b == "p41234"
    monkeypatch.setenv("MASTER_PORT", "41999")  # the next round's new port
    assert storehost.generation() != on_b


def test_with_the_shared_store_the_restart_count_tells_rounds_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The agent's store keeps one master port for every round.
    _env(monkeypatch, TORCHELASTIC_USE_AGENT_STORE="True", MASTER_PORT="29500")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    first = storehost.generation()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert storehost.generation() != first
    _env(monkeypatch)  # no launcher at all
    assert storehost.generation() == "g0p0"
