"""The escalation ladder, the cooldown and the restart budget: repeated faults climb
in_process -> launcher -> exclude_node -> stop_job, and a restart storm yields a bounded
number of actions."""

from __future__ import annotations

import itertools
from typing import Any

LADDER_POLICY = """
[escalation]
window_s = 600
in_process = 2
launcher = 1
exclude_node = 1
[limits]
cooldown_s = 0
budget_per_hour = 100
"""


def fault(c: Any, job: str = "job", node: str = "n1", rank: int = 0) -> None:
    c.event(node, "exception", job=job, rank=rank, message="RuntimeError: boom")
    c.decide()


def test_repeated_failures_climb_the_ladder(make_cluster: Any) -> None:
    c = make_cluster(LADDER_POLICY)
    c.job("job", {"n1": (0, 1), "n2": (2, 3)})
    levels = []
    for _ in range(5):
        c.clock.advance(30)  # each fault its own episode
        fault(c)
        levels.append(c.incidents("job")[-1]["level"])
        c.recover()
    assert levels == ["in_process", "in_process", "launcher", "exclude_node", "stop_job"]
    incs = c.incidents("job")
    # exclude_node: n1 (where the faults are) cordoned, the launcher restart on n2 only.
    assert [(x["node"], x["action"]) for x in incs[3]["commands"]] == [("n2", "launcher")]
    assert c.client.get("/api/v1/nodes/n1").json()["cordoned"] is True
    assert "2 in_process actions within 600 s" in incs[2]["decisions"][-1]["why"]
    stopped = incs[4]
    assert stopped["status"] == "stopped" and stopped["commands"] == []
    assert "no more automatic restarts" in stopped["outcome"]
    # A job given up stays given up: later evidence joins the stopped incident.
    c.clock.advance(30)
    fault(c, node="n2", rank=2)
    assert len(c.incidents("job")) == 5
    assert len(c.incidents("job")[-1]["evidence"]) == 2


def test_the_ladder_forgets_actions_older_than_the_window(make_cluster: Any) -> None:
    c = make_cluster(LADDER_POLICY)
    c.job("job", {"n1": (0,), "n2": (1,)})
    for _ in range(2):
        c.clock.advance(30)
        fault(c)
        c.recover()
    c.clock.advance(601)
    fault(c)
    assert c.incidents("job")[-1]["level"] == "in_process"


def test_a_failed_action_climbs_one_level_at_once(make_cluster: Any) -> None:
    c = make_cluster(LADDER_POLICY)
    c.job("job", {"n1": (0,), "n2": (1,)})
    fault(c)
    (inc,) = c.incidents("job")
    first = {x["node"]: x["id"] for x in inc["commands"]}
    c.ack(first["n1"], "n1", "delivered")
    c.ack(first["n2"], "n2", "delivered", "failed", detail="a rank exited during the restart")
    c.decide()  # the sweep sees the failure
    (inc,) = c.incidents("job")
    assert inc["status"] == "open" and inc["level"] == "launcher" and inc["escalations"] == 1
    assert "failed on n2" in inc["decisions"][-1]["why"]
    second = [x for x in inc["commands"] if x["id"] not in first.values()]
    assert sorted((x["node"], x["action"]) for x in second) == [
        ("n1", "launcher"),
        ("n2", "launcher"),
    ]
    # Acks of the superseded in_process command no longer move the incident.
    c.ack(first["n1"], "n1", "torn_down", "restarted", "resumed")
    assert c.incidents("job")[0]["status"] == "open"
    for x in second:
        c.ack(x["id"], x["node"], "delivered", "torn_down", "restarted", "resumed")
    inc = c.incidents("job")[0]
    assert inc["status"] == "resolved" and inc["outcome"] == "resumed"
    t = inc["timeline"]
    assert t["fault_at"] <= t["decided_at"] <= t["delivered_at"] <= t["resumed_at"]


def test_cooldown_defers_an_action_and_later_evidence_joins_it(make_cluster: Any) -> None:
    c = make_cluster("[limits]\ncooldown_s = 20\n")
    c.job("job", {"n1": (0,)})
    fault(c)
    c.recover()
    c.clock.advance(12)  # a new fault 12 s after the last action: inside the cooldown
    fault(c)
    waiting = c.incidents("job")[-1]
    assert waiting["status"] == "open" and waiting["commands"] == []
    assert waiting["not_before"] is not None and "cooldown" in waiting["outcome"]
    fault(c, rank=0)  # more evidence while it waits
    c.clock.advance(7)
    c.decide()
    assert c.incidents("job")[-1]["commands"] == []
    c.clock.advance(2)  # 21 s after the last action
    c.decide()
    acted = c.incidents("job")[-1]
    assert [x["action"] for x in acted["commands"]] == ["in_process"]
    assert len(acted["evidence"]) == 2 and len(c.incidents("job")) == 2


def test_cooldown_and_budget_stop_a_restart_storm(make_cluster: Any) -> None:
    """100 exceptions in one minute, each after the last restart succeeded: the cooldown
    spaces the actions, the budget ends them, and the job is given up."""
    c = make_cluster(
        "[limits]\ncooldown_s = 10\nbudget_per_hour = 4\n"
        "[escalation]\nin_process = 100\nlauncher = 100\n"
    )
    c.job("job", {"n1": (0, 1), "n2": (2, 3)})
    commands = 0
    for i in range(100):
        c.clock.advance(0.6)
        c.event("n1" if i % 2 else "n2", "exception", job="job", rank=i % 4, message=f"err {i}")
        c.decide()
        commands += c.recover()  # every restart "works", the job crashes again
    incs = c.incidents("job")
    actions = [d for x in incs for d in x["decisions"] if d.get("restart")]
    assert len(actions) == 4  # the budget, spaced by the cooldown
    assert commands == 4 * 2  # one command per node per action
    gaps = [b["at"] - a["at"] for a, b in itertools.pairwise(actions)]
    assert all(g >= 10 for g in gaps)
    assert incs[-1]["status"] == "stopped" and "budget" in incs[-1]["outcome"]
    assert len(incs) <= 6  # the 100 exceptions were merged, not one incident each
    assert sum(len(x["evidence"]) for x in incs) == 100
