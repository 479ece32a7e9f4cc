from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.config import AgentConfig


def test_defaults_follow_the_node_name(monkeypatch):
    monkeypatch.delenv("TRAINGUARD_AGENT_NODE", raising=False)
    c = AgentConfig(node="gpu-017")
    assert c.spool_dir == Path.home() / ".local/state/trainguard/spool/gpu-017"
    assert c.socket_path == Path("/tmp/trainguard-agent-gpu-017.sock")
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
