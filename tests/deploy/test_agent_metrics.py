"""The agent's Prometheus exporter: a real simulated agent with its SDK server, a rank
(this test process, through the real SDK) and the exporter on a free port, scraped over
HTTP and parsed with prometheus-client's own parser."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support import wait_for
from trainguard import sdk
from trainguard.agent.config import AgentConfig
from trainguard.agent.daemon import Agent, build_agent
from trainguard.agent.metrics import DCGM_FIELDS, AgentExporter
from trainguard.agent.ranks.server import LocalServer


def _ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"seq": 1, "duplicate": False})


def _scrape(port: int) -> dict[str, list[Any]]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    out: dict[str, list[Any]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def _agent(tmp_path: Path) -> tuple[Agent, LocalServer, AgentExporter]:
    cfg = AgentConfig(
        node="node-7",
        server="http://backend",
        spool_dir=tmp_path / "spool",
        socket_path=tmp_path / "tg.sock",
        simulate=2,
        interval=0.02,
    )
    agent = build_agent(cfg, transport=httpx.MockTransport(_ok))
    local = LocalServer(agent)
    exporter = AgentExporter(agent, port=0, host="127.0.0.1")
    agent.add_component(local)
    agent.add_component(exporter)
    return agent, local, exporter


def _run(agent: Agent, exporter: AgentExporter) -> threading.Thread:
    t = threading.Thread(target=agent.run)
    t.start()
    wait_for(lambda: exporter._server is not None or not t.is_alive())
    return t


def test_gpu_readings_carry_dcgm_exporter_names_and_labels(tmp_path: Path) -> None:
    agent, _, exporter = _agent(tmp_path)
    t = _run(agent, exporter)
    try:
        m = wait_for(lambda: (s := _scrape(exporter.port)).get("DCGM_FI_DEV_GPU_UTIL") and s)
        (util0,) = [s for s in m["DCGM_FI_DEV_GPU_UTIL"] if s.labels["gpu"] == "0"]
        assert util0.labels == {
            "gpu": "0",
            "UUID": "GPU-sim-node-7-0",
            "device": "nvidia0",
            "modelName": "Simulated NVIDIA H100 80GB HBM3",
            "pci_bus_id": util0.labels["pci_bus_id"],
            "Hostname": "node-7",
            "simulated": "true",
        }
        assert util0.labels["pci_bus_id"]
        for name in (
            "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_FB_USED",
            "DCGM_FI_DEV_SM_CLOCK",
            "DCGM_FI_DEV_FB_FREE",
            "DCGM_FI_DEV_XID_ERRORS",
        ):
            assert {s.labels["gpu"] for s in m[name]} == {"0", "1"}, name
        used = {s.labels["gpu"]: s.value for s in m["DCGM_FI_DEV_FB_USED"]}
        free = {s.labels["gpu"]: s.value for s in m["DCGM_FI_DEV_FB_FREE"]}
        assert all(abs(used[g] + free[g] - 81559.0) < 1e-6 for g in used)
        assert {s.labels["source"] for s in m["trainguard_agent_info"]} == {"simulated"}
        # every field the simulated source fills is exported under its dcgm name
        sample = next(iter(exporter.readings.last.values()))
        filled = {n for f, n, _ in DCGM_FIELDS if getattr(sample, f) is not None}
        assert len(filled) >= 12 and filled <= set(m)
    finally:
        agent.stop()
        t.join(10)
    assert not t.is_alive()
    assert "put_samples" not in vars(agent.outbox)  # detached on stop


def test_xids_by_code_rank_heartbeat_ages_and_uplink_counters(tmp_path: Path) -> None:
    agent, local, exporter = _agent(tmp_path)
    t = _run(agent, exporter)
    tg = None
    try:
        tg = sdk.attach(
            job="llama",
            rank=5,
            local_rank=1,
            world_size=8,
            socket_path=local.socket_path,
            heartbeat_interval=0.05,
            install_signal_handler=False,
        )
        for n in range(3):
            with tg.step(n):
                pass
        assert agent.simulated is not None
        agent.simulated.inject_xid(1, 79)
        agent.simulated.inject_xid(1, 79)  # within the dedup window: still reported by sim
        agent.simulated.inject_xid(0, 48)

        def ready() -> dict[str, list[Any]] | None:
            m = _scrape(exporter.port)
            steps = m.get("trainguard_agent_rank_last_step", [])
            sent = m.get("trainguard_agent_uplink_batches_sent_total", [])
            if steps and steps[0].value == 2 and sent and sent[0].value > 0:
                return m
            return None

        m = wait_for(ready)
        xids = {
            (s.labels["UUID"], s.labels["xid"]): s.value
            for s in m["trainguard_agent_xid_errors_total"]
        }
        assert xids[("GPU-sim-node-7-0", "48")] == 1
        assert xids[("GPU-sim-node-7-1", "79")] >= 1
        last = {s.labels["gpu"]: s.value for s in m["DCGM_FI_DEV_XID_ERRORS"]}
        assert last == {"0": 48.0, "1": 79.0}
        (age,) = m["trainguard_agent_rank_heartbeat_age_seconds"]
        assert age.labels == {"Hostname": "node-7", "job": "llama", "rank": "5", "local_rank": "1"}
        assert 0 <= age.value < 5
        (alive,) = m["trainguard_agent_rank_alive"]
        assert alive.value == 1
        assert m["trainguard_agent_uplink_connected"][0].value == 1
        assert m["trainguard_agent_uplink_backlog_batches"][0].value == 0
    finally:
        if tg is not None:
            tg.close()
        agent.stop()
        t.join(10)


def test_a_taken_port_stops_the_agent_with_one_line(tmp_path: Path, caplog: Any) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        agent, _, exporter = _agent(tmp_path)
        exporter.port = busy.getsockname()[1]
        assert agent.run() == 1
    assert any("metrics port 127.0.0.1:" in r.getMessage() for r in caplog.records)
    assert "put_samples" not in vars(agent.outbox)
