"""The escalation ladder, the cooldown and the restart budget: repeated faults climb
in_process -> launcher -> exclude_node -> stop_job (exclude_node only on evidence about a
node's hardware), and a restart storm yields a bounded number of actions."""

from __future__ import annotations

import itertools
from typing import Any

from trainguard.protocol import wire

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
    for _ in range(4):
        c.clock.advance(30)  # each fault its own episode
        fault(c)
        levels.append(c.incidents("job")[-1]["level"])
        c.recover()
    # Exceptions say nothing against a node: the ladder skips exclude_node.
    assert levels == ["in_process", "in_process", "launcher", "stop_job"]
    incs = c.incidents("job")
    assert "2 in_process actions within 600 s" in incs[2]["decisions"][-1]["why"]
    assert "1 launcher actions within 600 s: stop_job" in incs[3]["decisions"][-1]["why"]
    for node in ("n1", "n2"):
        assert c.client.get(f"/api/v1/nodes/{node}").json()["cordoned"] is False
    stopped = incs[3]
    assert stopped["status"] == "stopped"
    # stop_job ends the job through its launcher on each of its nodes (acked above).
    assert sorted((k["action"], k["node"]) for k in stopped["commands"]) == [
        ("stop_job", "n1"),
        ("stop_job", "n2"),
    ]
    assert "no more automatic restarts" in stopped["outcome"]
    job = c.client.get("/api/v1/jobs/job").json()
    assert job["state"] == "stopped"
    assert job["state_reason"].endswith("trainguard ended its launcher on n1, n2"), job
    # A job given up stays given up: later evidence joins the stopped incident.
    c.clock.advance(30)
    fault(c, node="n2", rank=2)
    assert len(c.incidents("job")) == 4
    assert len(c.incidents("job")[-1]["evidence"]) == 2


HARDWARE_LADDER = """
[xid]
repeat_count = 1000
[xid.buckets]
RESET_GPU = "launcher"
[escalation]
window_s = 600
launcher = 1
exclude_node = 1
[limits]
cooldown_s = 0
budget_per_hour = 100
"""


def test_repeated_hardware_faults_climb_to_exclude_the_node(make_cluster: Any) -> None:
    c = make_cluster(HARDWARE_LADDER)
    c.job("job", {"n1": (0, 1), "n2": (2, 3)})
    levels = []
    for _ in range(2):
        c.clock.advance(30)
        c.event("n1", "xid", xid=48, gpu_uuid="GPU-n1-0")  # a double-bit ECC error
        c.decide()
        levels.append(c.incidents("job")[-1]["level"])
        c.recover()
    assert levels == ["launcher", "exclude_node"]
    # n1 (where the XIDs are) cordoned and leaving the job, the launcher restart on n2.
    assert [(x["node"], x["action"]) for x in c.incidents("job")[1]["commands"]] == [
        ("n1", "exclude_node"),
        ("n2", "launcher"),
    ]
    node = c.client.get("/api/v1/nodes/n1").json()
    assert node["cordoned"] is True
    assert node["cordon"]["by"] == "engine" and "xid 48" in node["cordon"]["evidence"].lower()


def test_independent_hardware_faults_on_other_nodes_do_not_climb_the_ladder(
    make_cluster: Any,
) -> None:
    """#35: three XID 79s on three nodes of one 8-node job, 20 s apart, became stop_job
    on the third ("2 exclude_node actions within 1800 s"). Independent faults each exclude
    their node (the breaker caps how many); the same node excluded again climbs."""
    c = make_cluster("[breaker]\nmax_fraction = 1.0\nwindow_s = 600\n[limits]\ncooldown_s = 0\n")
    c.job("job", {f"n{i}": (2 * i, 2 * i + 1) for i in range(8)})
    for node in ("n1", "n2", "n3"):
        c.clock.advance(20)
        c.event(node, "xid", xid=79, gpu_uuid=f"GPU-{node}-0")
        c.decide()
        c.recover()
    incs = c.incidents("job")
    assert [i["level"] for i in incs] == ["exclude_node"] * 3, [i["decisions"] for i in incs]
    for node in ("n1", "n2", "n3"):
        assert c.client.get(f"/api/v1/nodes/{node}").json()["cordoned"] is True
    # n1 back (an operator readmits it) and failing again, twice: the second time climbs.
    levels = []
    for _ in range(2):
        r = c.client.post("/api/v1/nodes/n1/uncordon", json={"reason": "reseated"})
        assert r.status_code == 200, r.text
        c.job("job", {"n1": (2, 3)}, step=20)
        c.clock.advance(20)
        c.event("n1", "xid", xid=79, gpu_uuid="GPU-n1-0")
        c.decide()
        c.recover()
        levels.append(c.incidents("job")[-1]["level"])
    assert levels == ["exclude_node", "stop_job"], levels
    why = c.incidents("job")[-1]["decisions"][-1]["why"]
    assert "2 exclude_node actions of n1 within 1800 s: stop_job" in why, why


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
    # one command per node per action, then stop_job's to end the launcher on each node
    assert commands == 4 * 2 + 2
    gaps = [b["at"] - a["at"] for a, b in itertools.pairwise(actions)]
    assert all(g >= 10 for g in gaps)
    assert incs[-1]["status"] == "stopped" and "budget" in incs[-1]["outcome"]
    assert len(incs) <= 6  # the 100 exceptions were merged, not one incident each
    assert sum(len(x["evidence"]) for x in incs) == 100


NO_LIVE_RANK = "no live rank of job job on this node"


def steps_of_attempt(c: Any, attempt: int, layout: dict[str, tuple[int, ...]], step: int) -> None:
    """Every rank of the job completes `step` in a new launcher generation."""
    for node, ranks in layout.items():
        c.post(
            node,
            steps=[
                wire.StepReport(
                    job="job",
                    rank=r,
                    step=step,
                    start=c.clock.t - 0.5,
                    end=c.clock.t,
                    attempt=attempt,
                )
                for r in ranks
            ],
        )


def test_no_live_rank_while_the_launcher_restarts_waits_for_it_and_cordons_nothing(
    make_cluster: Any,
) -> None:
    # The benchmark's sequence (docs/benchmarks-recovery.md): rank 1 on n1 is SIGKILLed;
    # the survivors' gloo errors arrive first -> in_process; n1's ft_launcher has already
    # stopped its other worker, so n1 acks "no live rank"; then the rank_exit; the
    # launcher commands find no live rank either (an agent without the executor that
    # follows the launcher). ft_launcher restarts the group by itself meanwhile.
    c = make_cluster("[escalation]\nrelaunch_wait_s = 30\n[limits]\ncooldown_s = 0\n")
    layout = {"n1": (0, 1), "n2": (2, 3)}
    c.job("job", layout)
    c.event("n2", "exception", job="job", rank=2, message="RuntimeError: gloo Read error")
    c.decide()
    (inc,) = c.incidents("job")
    first = {x["node"]: x["id"] for x in inc["commands"]}
    c.ack(first["n1"], "n1", "delivered", "failed", detail=NO_LIVE_RANK)
    c.decide()
    (inc,) = c.incidents("job")
    # n1's workers were gone; n2's command is still under way: the incident goes on.
    assert inc["status"] == "open" and inc["level"] == "in_process", inc
    assert len(inc["commands"]) == 2
    # The rank's death: stronger evidence of the same episode -> launcher, at once.
    c.event(
        "n1", "rank_exit", job="job", rank=1, message="rank 1 exited (signal 9)", data={"signal": 9}
    )
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["level"] == "launcher" and inc["status"] == "open"
    second = [x for x in inc["commands"] if x["id"] not in first.values()]
    assert sorted(x["node"] for x in second) == ["n1", "n2"]
    for x in second:
        c.ack(x["id"], x["node"], "delivered", "failed", detail=NO_LIVE_RANK)
    c.clock.advance(1)
    c.decide()
    (inc,) = c.incidents("job")
    # Every node's workers were gone: the launcher is restarting them; wait for it.
    assert inc["status"] == "open" and inc["level"] == "launcher", inc
    assert "waiting up to 30 s" in inc["outcome"]
    # ft_launcher's new generation steps: the incident is resolved, nothing was cordoned.
    c.clock.advance(5)
    steps_of_attempt(c, 1, layout, step=11)
    c.clock.advance(3)
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["status"] == "resolved", inc
    assert [d["level"] for d in inc["decisions"]] == ["in_process", "launcher"]
    assert not any(c.client.get(f"/api/v1/nodes/{n}").json()["cordoned"] for n in layout)
    # A later fault is a new episode, handled as usual (nothing was given up).
    c.clock.advance(60)
    fault(c, node="n2", rank=2)
    assert len(c.incidents("job")) == 2 and c.incidents("job")[-1]["level"] == "in_process"


def test_no_live_rank_climbs_when_no_new_generation_comes(make_cluster: Any) -> None:
    c = make_cluster("[escalation]\nrelaunch_wait_s = 30\n")
    c.job("job", {"n1": (0,), "n2": (1,)})
    fault(c)
    (inc,) = c.incidents("job")
    for x in inc["commands"]:
        c.ack(x["id"], x["node"], "delivered", "failed", detail=NO_LIVE_RANK)
    c.decide()
    assert c.incidents("job")[0]["status"] == "open"
    c.clock.advance(29)
    c.decide()
    assert c.incidents("job")[0]["level"] == "in_process"
    c.clock.advance(2)
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["level"] == "launcher" and inc["escalations"] == 1 and inc["status"] == "open"
    assert "no step of a new generation within 30 s" in inc["decisions"][-1]["why"]


def test_no_live_rank_from_a_silent_node_climbs_at_once(make_cluster: Any) -> None:
    c = make_cluster("[escalation]\nrelaunch_wait_s = 30\n", fresh=60)
    c.job("job", {"n1": (0,), "n2": (1,)})
    fault(c)
    (inc,) = c.incidents("job")
    for x in sorted(inc["commands"], key=lambda x: x["node"] != "n1"):
        c.ack(x["id"], x["node"], "delivered", "failed", detail=NO_LIVE_RANK)
    c.heard("n1", c.clock.t - 120)  # n1's agent went silent since
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["level"] == "launcher" and inc["escalations"] == 1


GIVE_UP = '[causes]\nexception = "stop_job"\n'


def test_a_stop_the_agent_cannot_carry_out_says_the_launcher_still_restarts_the_job(
    make_cluster: Any,
) -> None:
    """stop_job whose command fails on one node (the agent may not signal the launcher):
    the job reads `stopped` with exactly that, and the steps that keep coming are its
    own; once its ranks exit 0 it is finished."""
    c = make_cluster(GIVE_UP)
    c.job("job", {"n1": (0, 1), "n2": (2, 3)})
    fault(c)
    (inc,) = c.incidents("job")
    cmds = {k["node"]: k["id"] for k in inc["commands"]}
    c.ack(cmds["n1"], "n1", "delivered", "torn_down", detail="ended pid 4242 with SIGTERM")
    job = c.client.get("/api/v1/jobs/job").json()
    assert job["state_reason"].endswith("trainguard is ending its launcher"), job  # n2 to come
    c.ack(cmds["n2"], "n2", "delivered")
    c.ack(cmds["n2"], "n2", "failed", detail="not permitted to signal pid 77")
    job = c.client.get("/api/v1/jobs/job").json()
    assert job["state"] == "stopped", job
    assert job["state_reason"] == (
        f"incident {inc['id']}: policy causes.exception; trainguard stopped acting; the "
        "launcher still restarts it (n2: not permitted to signal pid 77)"
    )
    c.clock.advance(5)
    c.job("job", {"n2": (2, 3)}, step=40)  # it trains on
    c.decide()
    job = c.client.get("/api/v1/jobs/job").json()
    assert (job["state"], job["last_step"], job["ended_at"]) == ("stopped", 40, None), job
    assert [i["id"] for i in c.incidents("job")] == [inc["id"]]  # given up: no new one


def test_a_stop_signal_under_a_living_launcher_is_a_fault(make_cluster: Any) -> None:
    """A worker killed by SIGTERM whose launcher lives on (the agent waited for it) is no
    stop of the job: the engine acts on it like any lost rank. The same exit with its
    launcher gone makes nothing."""
    c = make_cluster()
    c.job("job", {"n1": (0, 1)})
    stop = {"signal": 15, "clean": False, "stop_signal": 15}
    c.event("n1", "rank_exit", job="job", rank=1, data={**stop, "launcher_exited": True})
    c.decide()
    assert c.incidents("job") == []
    c.clock.advance(30)
    c.event("n1", "rank_exit", job="job", rank=0, data={**stop, "launcher_exited": False})
    c.decide()
    (inc,) = c.incidents("job")
    assert (inc["cause"], inc["level"]) == ("rank_exit", "launcher"), inc


def test_an_unread_exit_reads_as_its_launcher_says(make_cluster: Any) -> None:
    """An exit whose status the agent could not read (its launcher reaped it first) is a
    stop when its launcher exited too, a fault when the launcher lives on, and a fault
    whatever the launcher did when the rank reported an uncaught exception."""
    c = make_cluster()
    c.job("stopped", {"n1": (0, 1)})
    c.job("lives", {"n2": (0, 1)})
    c.job("crashed", {"n3": (0, 1)})
    unread = {"clean": False, "reaped": True}
    c.event("n1", "rank_exit", job="stopped", rank=1, data={**unread, "launcher_exited": True})
    c.event("n2", "rank_exit", job="lives", rank=1, data={**unread, "launcher_exited": False})
    crashed = {**unread, "uncaught": "RuntimeError", "launcher_exited": True}
    c.event("n3", "rank_exit", job="crashed", rank=1, data=crashed)
    c.decide()
    assert c.incidents("stopped") == []
    assert [i["cause"] for i in c.incidents("lives")] == ["rank_exit"]
    assert [i["cause"] for i in c.incidents("crashed")] == ["rank_exit"]


def test_a_restart_that_stopped_short_of_an_end_fails_once_the_job_is_gone(
    make_cluster: Any,
) -> None:
    """bench chaos (#33, D): a launcher restart acked `torn_down` and nothing after (the
    agent that carried it out restarted and forgot it; the launcher, its budget spent,
    started nothing) left its incident open under way and the job `restarting` for good.
    With no rank of the job alive, it fails 240 s after the last ack (the agent's own
    wait is 180 s), and the job ends."""
    c = make_cluster()
    c.job("job", {"n1": (0, 1)})
    c.event("n1", "rank_exit", job="job", rank=1, data={"signal": 9, "clean": False})
    c.decide()
    (inc,) = c.incidents("job")
    (cmd,) = c.commands("n1")
    assert cmd["action"] == "launcher"
    c.ack(cmd["id"], "n1", "delivered", "torn_down")
    gone = [wire.RankStatus(job="job", rank=r, pid=1000 + r, alive=False) for r in (0, 1)]
    c.post("n1", ranks=gone)
    c.clock.advance(200)
    c.post("n1", ranks=gone)
    c.decide()
    assert c.incidents("job")[0]["status"] == "open"  # the launcher may still restart it
    assert c.client.get("/api/v1/jobs/job").json()["state"] == "restarting"
    c.clock.advance(50)
    c.post("n1", ranks=gone)
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["status"] == "failed", inc
    assert "stopped at torn_down on n1" in inc["outcome"], inc
    c.clock.advance(130)
    c.decide()
    job = c.client.get("/api/v1/jobs/job").json()
    assert job["state"] == "failed" and job["ended_at"] is not None, job
