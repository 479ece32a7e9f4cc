"""Agent silence is not node death (issue #33 item 1), with real processes: a backend
(TRAINGUARD_NODE_DOWN_AFTER_S = 2 s), two agents and a job whose torch-free ranks, one on
each node, keep stepping while one node's agent is stopped.

- SIGTERM (an upgrade): the agent says goodbye; its node reads `agent_down`, is never
  cordoned, no incident; started again, the node is healthy, the job running.
- SIGKILL (no goodbye) while the other node's rank steps on: an `agent_silent` alert,
  the node reads `down`, no exclusion.
A SIGKILLed agent whose job stopped stepping everywhere is still excluded
(tests/backend/engine/test_agent_silence.py, test_incidents.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.harness import Agent, Backend, Procs, agent_tokens
from tests.support import free_port, wait_for
from trainguard.backend import db

pytestmark = pytest.mark.slow

DOWN_AFTER_S = 2.0
# In step with each other, as synchronous training is (an all-reduce per step): step n
# of every rank ends at epoch + (n + 1) x 0.05 s.
RANK = """
import sys, time
from trainguard import sdk
tg = sdk.attach(job="twojob", rank=int(sys.argv[2]), world_size=2, socket_path=sys.argv[1],
                heartbeat_interval=0.2)
epoch = float(sys.argv[3])
while True:
    step = int((time.time() - epoch) / 0.05)
    with tg.step(step):
        time.sleep(max(0.0, epoch + (step + 1) * 0.05 - time.time()))
"""


def _setup(procs: Procs, tmp_path: Path) -> tuple[Any, Agent, Agent]:
    data = tmp_path / "data"
    data.mkdir()
    url = f"sqlite:///{data / 'trainguard.db'}"
    db.upgrade(url)
    tokens = agent_tokens(url, ["upgraded", "steady"])
    port = free_port()
    env = {"TRAINGUARD_DATA_DIR": str(data), "TRAINGUARD_NODE_DOWN_AFTER_S": str(DOWN_AFTER_S)}
    api = Backend(procs, port, env).start().api()
    agents = [Agent(procs, n, tokens[n], port, interval=0.2).start() for n in tokens]
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    epoch = str(time.time())
    for rank, agent in enumerate(agents):
        sock = str(tmp_path / f"{agent.node}.sock")
        procs.spawn(f"rank{rank}", [sys.executable, str(script), sock, str(rank), epoch], {})

    def stepping() -> bool:
        ranks = api.get("/jobs/twojob").json().get("ranks") or []
        return len(ranks) == 2 and all(r["last_step"] is not None for r in ranks)

    wait_for(stepping, 60)
    wait_for(lambda: _status(api) == {"upgraded": "healthy", "steady": "healthy"}, 60)
    return api, agents[0], agents[1]


def _status(api: Any) -> dict[str, str]:
    return {n["name"]: n["status"] for n in api.get("/nodes").json()}


def _no_exclusion(api: Any) -> None:
    assert api.get("/incidents", params={"job": "twojob"}).json() == []
    assert api.get("/nodes/upgraded").json()["cordoned"] is False
    assert api.get("/jobs/twojob").json()["state"] == "running"


def test_an_agent_stopped_for_an_upgrade_is_agent_down_never_cordoned(
    procs: Procs, tmp_path: Path
) -> None:
    api, upgraded, _steady = _setup(procs, tmp_path)
    assert upgraded.stop() == 0  # SIGTERM
    wait_for(lambda: _status(api)["upgraded"] == "agent_down", DOWN_AFTER_S + 30)
    node = api.get("/nodes/upgraded").json()
    assert node["going_away"] == "SIGTERM: the agent is stopping", node
    # Judged by the engine for several thresholds, its ranks stepping on: nothing done.
    deadline = time.monotonic() + 4 * DOWN_AFTER_S
    while time.monotonic() < deadline:
        _no_exclusion(api)
        assert _status(api)["upgraded"] == "agent_down"
        time.sleep(0.5)
    assert api.get("/events", params={"kind": "agent_silent"}).json() == []

    upgraded.start()  # the new version
    wait_for(lambda: _status(api)["upgraded"] == "healthy", 30)
    assert api.get("/nodes/upgraded").json()["going_away"] is None
    _no_exclusion(api)


def test_an_agent_killed_while_its_job_steps_elsewhere_is_an_alert_not_an_exclusion(
    procs: Procs, tmp_path: Path
) -> None:
    api, upgraded, _steady = _setup(procs, tmp_path)
    assert upgraded.proc is not None
    Procs.kill(upgraded.proc)  # SIGKILL: no goodbye
    wait_for(lambda: _status(api)["upgraded"] == "down", DOWN_AFTER_S + 30)

    def alerts() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = api.get("/events", params={"kind": "agent_silent"}).json()
        return got

    (alert,) = wait_for(alerts, 30)
    assert alert["node"] == "upgraded" and alert["job"] == "twojob", alert
    assert "its ranks train on" in alert["message"], alert
    _no_exclusion(api)

    upgraded.start()
    wait_for(lambda: _status(api)["upgraded"] == "healthy", 30)
    _no_exclusion(api)
    assert len(alerts()) == 1
