"""The wire for real: a real `trainguard agent` process posts over HTTP to a real
`trainguard server` (uvicorn on a loopback port), and the data shows in the read API."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.support import AUTH, TOKEN, free_port, spooled_samples, wait_for

pytestmark = pytest.mark.slow


class Procs:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> Any:
        log = (self.tmp / f"{name}.log").open("wb")
        p = subprocess.Popen(
            [sys.executable, "-m", "trainguard.agent.cli", *args],
            env={**os.environ, "TRAINGUARD_ADMIN_TOKEN": TOKEN, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(p)
        return p

    def stop(self, p: Any) -> None:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    ps = Procs(tmp_path)
    yield ps
    for p in reversed(ps.procs):
        ps.stop(p)


def start_server(procs: Procs, port: int) -> Any:
    p = procs.start(
        "server",
        "server",
        "--port",
        str(port),
        "--log-level",
        "warning",
        env={"TRAINGUARD_DATA_DIR": str(procs.tmp / "data")},
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert p.poll() is None, (procs.tmp / "server.log").read_text()
        try:
            return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(ready, 60, 0.2)
    return p


def start_agent(procs: Procs, port: int, node: str) -> Any:
    return procs.start(
        f"agent-{node}",
        "agent",
        "--server",
        f"http://127.0.0.1:{port}",
        "--token",
        TOKEN,
        "--node",
        node,
        "--simulate",
        "2",
        env={
            "TRAINGUARD_AGENT_INTERVAL": "0.2",
            "TRAINGUARD_AGENT_SPOOL_DIR": str(procs.tmp / "spool" / node),
            "TRAINGUARD_AGENT_SOCKET_PATH": str(procs.tmp / f"{node}.sock"),
        },
    )


def test_agent_data_reaches_the_read_api(procs: Procs) -> None:
    port = free_port()
    start_server(procs, port)
    start_agent(procs, port, "e2e-node")
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", headers=AUTH, timeout=5)
    nodes = wait_for(lambda: [n for n in api.get("/nodes").json() if n["gpu_count"] == 2], 30)
    assert nodes[0]["name"] == "e2e-node" and nodes[0]["simulated"] is True
    assert nodes[0]["status"] == "healthy"
    gpus = api.get("/nodes/e2e-node/gpus").json()
    assert [g["index"] for g in gpus] == [0, 1] and all(g["simulated"] for g in gpus)
    uuid = gpus[0]["uuid"]
    series = wait_for(
        lambda: (c := api.get(f"/gpus/{uuid}/samples").json()["columns"])["util"][3:] and c, 30
    )
    assert all(0 <= u <= 100 for u in series["util"] if u is not None)
    events = api.get("/events", params={"node": "e2e-node", "kind": "agent_start"}).json()
    assert len(events) == 1


def test_agent_spools_while_the_backend_is_down_and_delivers_everything_once(
    procs: Procs,
) -> None:
    port = free_port()
    agent = start_agent(procs, port, "spool-node")  # no server listening yet
    spool = procs.tmp / "spool" / "spool-node"

    def spooled() -> int:
        return spooled_samples(spool)

    wait_for(lambda: spooled() >= 10, 30)  # 5 ticks of 2 GPUs
    peak = spooled()
    down_until = time.time()
    start_server(procs, port)
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", headers=AUTH, timeout=5)
    wait_for(lambda: api.get("/nodes").json(), 30)
    uuid = wait_for(lambda: api.get("/nodes/spool-node/gpus").json(), 30)[0]["uuid"]
    # Samples taken while the backend was down arrive after it comes back.
    early = wait_for(
        lambda: [
            t
            for t in api.get(
                f"/gpus/{uuid}/samples", params={"until": down_until, "points": 5000}
            ).json()["columns"]["ts"]
            if t is not None
        ],
        30,
    )
    assert min(early) < down_until
    wait_for(lambda: spooled() == 0, 60)  # the whole spool is delivered
    procs.stop(agent)
    # Exactly once: no (gpu, ts) pair is stored twice.
    engine = create_engine(f"sqlite:///{procs.tmp / 'data' / 'trainguard.db'}")
    with engine.connect() as conn:
        dupes = conn.execute(
            text("SELECT gpu_id, ts, COUNT(*) FROM samples GROUP BY gpu_id, ts HAVING COUNT(*) > 1")
        ).all()
        total = conn.execute(text("SELECT COUNT(*) FROM samples")).scalar_one()
    engine.dispose()
    assert dupes == []
    assert total >= peak  # what the spool held, stored
