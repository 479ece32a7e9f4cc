"""Agent silence is not node death (issue #33 item 1): a silent agent whose node's ranks
still train (the job's steps go on on other nodes), or one that said goodbye, is never
taken for a dead node; a silent node whose job's steps stopped everywhere still is
(test_incidents.py, test_a_silent_node_hosting_live_ranks_is_excluded)."""

from __future__ import annotations

import time
from typing import Any

from tests.backend.engine.conftest import Cluster
from trainguard.protocol import wire

DOWN_AFTER_S = 20.0  # TRAINGUARD_NODE_DOWN_AFTER_S
GOODBYE = "SIGTERM: the agent is stopping"


def _cluster(make_cluster: Any) -> Cluster:
    c: Cluster = make_cluster(fresh=DOWN_AFTER_S, node_down_after_s=DOWN_AFTER_S)
    c.job("job", {"n1": (0,), "n2": (1,)}, step=10)
    return c


def _train_on(c: Cluster, node: str, rank: int, steps: range) -> None:
    """The node's agent reports its rank's steps, one a second, up to the clock."""
    t = c.clock.t - len(steps)
    c.post(
        node,
        ranks=[wire.RankStatus(job="job", rank=rank, pid=1000 + rank, world_size=2)],
        steps=[
            wire.StepReport(job="job", rank=rank, step=s, start=t + i, end=t + i + 1)
            for i, s in enumerate(steps)
        ],
    )


def _silence(c: Cluster, node: str) -> None:
    """The engine has listened, and `node` has been silent for twice the threshold (by
    the backend's clock and the test's alike: /nodes reads time.time())."""
    c.decide()
    c.clock.advance(DOWN_AFTER_S)
    c.heard(node, min(c.clock.t, time.time()) - 2 * DOWN_AFTER_S)


def _node(c: Cluster, name: str) -> dict[str, Any]:
    body: dict[str, Any] = c.client.get(f"/api/v1/nodes/{name}").json()
    return body


def _alerts(c: Cluster) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = c.client.get(
        "/api/v1/events", params={"kind": "agent_silent"}
    ).json()
    return events


def test_an_agent_that_said_goodbye_is_agent_down_and_its_node_stays(make_cluster: Any) -> None:
    c = _cluster(make_cluster)
    c.post("n1", going_away=GOODBYE)  # SIGTERM: the agent's last batch
    _silence(c, "n1")
    _train_on(c, "n2", 1, range(11, 31))  # the ranks of both nodes train on
    for _ in range(3):
        c.decide()
        c.clock.advance(1)
    n1 = _node(c, "n1")
    assert (n1["status"], n1["cordoned"], n1["going_away"]) == ("agent_down", False, GOODBYE)
    assert c.incidents("job") == [] and _alerts(c) == []
    assert c.client.get("/api/v1/jobs/job").json()["state"] == "running"
    # The agent is back (upgraded): the node's state returns by itself.
    _train_on(c, "n1", 0, range(31, 33))
    c.decide()
    n1 = _node(c, "n1")
    assert (n1["status"], n1["going_away"]) == ("healthy", None)
    assert c.incidents("job") == []
    assert c.client.get("/api/v1/jobs/job").json()["state"] == "running"


def test_a_silent_agent_whose_job_trains_on_elsewhere_is_an_alert_not_an_exclusion(
    make_cluster: Any,
) -> None:
    c = _cluster(make_cluster)
    _silence(c, "n1")  # SIGKILL: no goodbye
    _train_on(c, "n2", 1, range(11, 31))
    for _ in range(3):
        c.decide()
        c.clock.advance(1)
    assert c.incidents("job") == []
    n1 = _node(c, "n1")
    assert (n1["status"], n1["cordoned"]) == ("down", False)
    (alert,) = _alerts(c)  # once per silence
    assert alert["node"] == "n1" and alert["job"] == "job"
    assert alert["message"].startswith("agent silent on n1")
    assert "its ranks train on: job job steps on other nodes" in alert["message"]
    # The agent comes back: healthy again, nothing to undo.
    _train_on(c, "n1", 0, range(31, 33))
    c.decide()
    assert _node(c, "n1")["status"] == "healthy"
    assert c.incidents("job") == []
    assert c.client.get("/api/v1/jobs/job").json()["state"] == "running"


def test_a_silent_agent_of_a_single_node_job_is_an_alert(make_cluster: Any) -> None:
    c: Cluster = make_cluster(fresh=DOWN_AFTER_S, node_down_after_s=DOWN_AFTER_S)
    c.job("solo", {"n1": (0, 1)})
    _silence(c, "n1")
    c.decide()
    assert c.incidents("solo") == []
    (alert,) = _alerts(c)
    assert "nothing says its ranks stopped" in alert["message"]
    assert _node(c, "n1")["cordoned"] is False


def test_a_silent_node_whose_job_stopped_stepping_everywhere_is_excluded(
    make_cluster: Any,
) -> None:
    c = _cluster(make_cluster)
    _silence(c, "n1")
    # n2's agent goes on reporting, but the job's steps stopped with n1's ranks: no step
    # of n2's rank past the one n1 reported last (the all-reduce waits for n1).
    _train_on(c, "n2", 1, range(0))
    c.decide()
    (inc,) = c.incidents("job")
    assert (inc["cause"], inc["level"], inc["node"]) == ("node_down", "exclude_node", "n1")
    assert _node(c, "n1")["cordoned"] is True
    assert _alerts(c) == []


def test_a_node_down_incident_closes_when_the_agent_comes_back_before_the_action(
    make_cluster: Any,
) -> None:
    # Dry run: the exclusion waits for an operator, and the agent reports again first.
    c: Cluster = make_cluster(
        'mode = "dry_run"\n', fresh=DOWN_AFTER_S, node_down_after_s=DOWN_AFTER_S
    )
    c.job("job", {"n1": (0,), "n2": (1,)}, step=10)
    _silence(c, "n1")
    _train_on(c, "n2", 1, range(0))
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["cause"] == "node_down" and inc["status"] == "pending"
    _train_on(c, "n1", 0, range(0))  # the agent is back
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["status"] == "resolved" and "reported again" in inc["outcome"]
    assert _node(c, "n1")["cordoned"] is False
