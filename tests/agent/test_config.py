from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from trainguard.agent.config import AgentConfig


def test_defaults_follow_the_node_name_but_the_socket_does_not(monkeypatch):
    for var in ("NODE", "SOCKET", "SOCKET_PATH"):
        monkeypatch.delenv(f"TRAINGUARD_AGENT_{var}", raising=False)
    c = AgentConfig(node="gpu-017")
    assert c.spool_dir == Path.home() / ".local/state/trainguard/spool/gpu-017"
    assert c.socket_path is None  # the well-known socket, the one the SDK looks for
    assert (c.interval, c.spool_max_bytes, c.inventory_every_s) == (1.0, 256 << 20, 60.0)
    assert c.kmsg_path == Path("/dev/kmsg") and c.simulate is None


def test_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("TRAINGUARD_AGENT_SERVER", "https://tg.example:8443/")
    monkeypatch.setenv("TRAINGUARD_AGENT_TOKEN", "s3cret-token")
    monkeypatch.setenv("TRAINGUARD_AGENT_NODE", "node-9")
    monkeypatch.setenv("TRAINGUARD_AGENT_SIMULATE", "4")
    c = AgentConfig()
    assert c.server == "https://tg.example:8443" and c.ingest_url.endswith(":8443/api/v1/ingest")
    assert (c.node, c.simulate, c.token) == ("node-9", 4, "s3cret-token")
    assert "s3cret" not in repr(c)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("interval", 0, "interval"),
        ("interval", -1, "interval"),
        ("server", "tg.example:8000", "http"),
        ("node", "bad node", "not a valid name"),
        ("simulate", 0, "simulate"),
        ("simulate", 65, "simulate"),
        ("spool_max_bytes", 1000, "1 MiB"),
        ("inventory_every_s", 0, "inventory_every_s"),
    ],
)
def test_unsafe_values_fail_fast(field, value, message):
    with pytest.raises(ValidationError, match=message):
        AgentConfig(**{"node": "n1", field: value})


def test_the_socket_comes_from_either_variable_the_agents_own_first(monkeypatch, tmp_path):
    monkeypatch.delenv("TRAINGUARD_AGENT_SOCKET_PATH", raising=False)
    monkeypatch.setenv("TRAINGUARD_AGENT_SOCKET", str(tmp_path / "shared.sock"))
    assert AgentConfig(node="n1").socket_path == tmp_path / "shared.sock"
    monkeypatch.setenv("TRAINGUARD_AGENT_SOCKET_PATH", str(tmp_path / "own.sock"))
    assert AgentConfig(node="n1").socket_path == tmp_path / "own.sock"
    assert AgentConfig(node="n1", socket_path="~/a.sock").socket_path == Path.home() / "a.sock"
    monkeypatch.setenv("SOCKET_PATH", "/not/ours.sock")  # no variable without the prefix
    monkeypatch.delenv("TRAINGUARD_AGENT_SOCKET_PATH")
    monkeypatch.delenv("TRAINGUARD_AGENT_SOCKET")
    assert AgentConfig(node="n1").socket_path is None


def test_the_config_file_names_the_socket_by_its_field(monkeypatch, tmp_path):
    for var in ("SOCKET", "SOCKET_PATH"):
        monkeypatch.delenv(f"TRAINGUARD_AGENT_{var}", raising=False)
    (tmp_path / "agent.toml").write_text('socket_path = "/run/trainguard/agent.sock"\n')
    monkeypatch.setenv("TRAINGUARD_AGENT_CONFIG", str(tmp_path / "agent.toml"))
    assert AgentConfig(node="n1").socket_path == Path("/run/trainguard/agent.sock")
