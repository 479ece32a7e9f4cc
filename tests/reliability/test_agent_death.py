"""An agent SIGKILLed: its node goes "down" after TRAINGUARD_NODE_DOWN_AFTER_S of silence
(here 2 s) while a healthy neighbour stays healthy; where the node hosts the rank of a
single-node job that runs on, nothing says the rank died, so the engine only alerts
(`agent_silent`: silence is not node death, issue #33; before, it cordoned the node);
an agent started again under the same node name brings the node back, once, with the same
GPUs, and nothing it had stored is doubled."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.reliability.harness import Agent, Backend, Ledger, Procs, agent_tokens
from tests.support import free_port, wait_for
from trainguard.backend import db

pytestmark = pytest.mark.slow

DOWN_AFTER_S = 2.0
RANK = """
import sys, time
from trainguard import sdk
tg = sdk.attach(job="deadjob", rank=0, world_size=1, socket_path=sys.argv[1],
                heartbeat_interval=0.2)
step = 0
while True:
    with tg.step(step):
        time.sleep(0.05)
    step += 1
"""


def test_a_dead_agent_marks_its_node_down_and_a_new_one_brings_it_back(
    procs: Procs, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    url = f"sqlite:///{data / 'trainguard.db'}"
    db.upgrade(url)
    nodes = ["mortal", "steady", "worker"]
    tokens = agent_tokens(url, nodes)
    port = free_port()
    backend = Backend(
        procs,
        port,
        {"TRAINGUARD_DATA_DIR": str(data), "TRAINGUARD_NODE_DOWN_AFTER_S": str(DOWN_AFTER_S)},
    ).start()
    api = backend.api()
    mortal, steady, worker = (Agent(procs, n, tokens[n], port, interval=0.2) for n in nodes)
    for a in (mortal, steady, worker):
        a.start()
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    procs.spawn("rank", [sys.executable, str(script), str(tmp_path / "worker.sock")], {})

    def status() -> dict[str, str]:
        return {n["name"]: n["status"] for n in api.get("/nodes").json()}

    wait_for(lambda: status() == dict.fromkeys(nodes, "healthy"), 60)
    wait_for(lambda: api.get("/jobs/deadjob").json().get("ranks"), 60)

    # Dies without a word: no flush, no goodbye.
    assert mortal.proc is not None and worker.proc is not None
    Procs.kill(mortal.proc)
    Procs.kill(worker.proc)
    wait_for(lambda: status()["mortal"] == "down", DOWN_AFTER_S + 30)
    assert status()["steady"] == "healthy"
    node = api.get("/nodes/mortal").json()
    assert node["status"] == "down" and node["gpu_count"] == 2

    # The engine: the silent node hosts a live rank of deadjob, a single-node job; no
    # other node says the rank stopped: an alert, no exclusion.
    def alerts() -> list[dict[str, object]]:
        got: list[dict[str, object]] = api.get("/events", params={"kind": "agent_silent"}).json()
        return got

    [alert] = wait_for(alerts, 30)
    assert alert["node"] == "worker" and alert["job"] == "deadjob", alert
    assert "nothing says its ranks stopped" in str(alert["message"]), alert
    assert status()["worker"] == "down"
    assert api.get("/incidents").json() == []

    # Back under the same name: one node, the same two GPUs, healthy again.
    mortal.start()
    wait_for(lambda: status()["mortal"] == "healthy", 30)
    names = [n["name"] for n in api.get("/nodes").json()]
    assert sorted(names) == sorted(nodes)
    gpus = api.get("/nodes/mortal/gpus").json()
    assert [g["index"] for g in gpus] == [0, 1]
    wait_for(lambda: mortal.spooled() == 0, 30)
    assert mortal.stop() == 0 and steady.stop() == 0

    ledger = Ledger.read(url)
    ledger.assert_exactly_once([mortal, steady], max_tick_gap_s=30.0)
    starts = api.get("/events", params={"node": "mortal", "kind": "agent_start"}).json()
    assert len(starts) == 2 and len({e["data"]["agent_id"] for e in starts}) == 2
