"""Incidents: one per fault episode, with merged evidence, the recovery timeline, lost
progress, and what the sweep finds on its own (silent nodes, missing acks)."""

from __future__ import annotations

import sys
from typing import Any

from sqlalchemy import select

from tests.support import wait_for
from trainguard.backend.models import AuditLog
from trainguard.protocol import wire


def test_an_xid_and_the_rank_exit_it_causes_are_one_incident(make_cluster: Any) -> None:
    c = make_cluster()
    c.job("job", {"n1": (0, 1), "n2": (2, 3)})
    t = c.clock.t
    c.event("n1", "xid", ts=t, xid=79, gpu_uuid="GPU-n1-1", data={"source": "kmsg"})
    c.event("n1", "rank_exit", ts=t + 0.4, job="job", rank=1, data={"exit_code": 1})
    c.event("n1", "rank_exit", ts=t + 0.5, job="job", rank=0, data={"signal": 6})
    c.decide()
    (inc,) = c.incidents("job")
    assert (inc["cause"], inc["level"], inc["node"], inc["xid"]) == (
        "xid 79",
        "exclude_node",
        "n1",
        79,
    )
    assert [e["kind"] for e in inc["evidence"]] == ["xid", "rank_exit", "rank_exit"]
    assert [(x["node"], x["action"]) for x in inc["commands"]] == [
        ("n1", "exclude_node"),
        ("n2", "launcher"),
    ]
    assert inc["timeline"]["fault_at"] == t  # the evidence's own clock


def test_an_xid_reported_after_the_rank_exit_escalates_the_same_incident(
    make_cluster: Any,
) -> None:
    c = make_cluster()
    c.job("job", {"n1": (0,), "n2": (1,)})
    t = c.clock.t
    c.event("n1", "rank_exit", ts=t, job="job", rank=0, data={"exit_code": 1})
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["level"] == "launcher" and len(inc["commands"]) == 2
    c.clock.advance(1)
    c.event("n1", "xid", ts=t - 0.2, xid=79)  # the kernel log is slower than the exit
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["level"] == "exclude_node" and inc["escalations"] == 1
    # The root stays the rank's exit; the XID escalated the action and is recorded so.
    assert inc["cause"] == "rank_exit" and inc["node"] == "n1"
    assert inc["timeline"]["fault_at"] == t
    assert "stronger evidence: xid 79 on n1" in inc["decisions"][-1]["why"]
    assert inc["decisions"][-1]["node"] == "n1"
    latest = [x for x in inc["commands"] if x["issued_at"] >= inc["acted_at"]]
    assert [(x["node"], x["action"]) for x in latest] == [
        ("n1", "exclude_node"),
        ("n2", "launcher"),
    ]


def test_the_exceptions_of_one_failure_on_every_rank_are_one_incident(make_cluster: Any) -> None:
    c = make_cluster()
    c.job("job", {"n1": (0, 1), "n2": (2, 3)})
    for rank, node in ((0, "n1"), (1, "n1"), (2, "n2"), (3, "n2")):
        c.event(node, "exception", job="job", rank=rank, message="NCCL error: timeout")
    c.decide()
    (inc,) = c.incidents("job")
    assert len(inc["evidence"]) == 4
    assert sorted((x["node"], x["action"]) for x in inc["commands"]) == [
        ("n1", "in_process"),
        ("n2", "in_process"),
    ]


def test_timeline_trigger_and_lost_steps(make_cluster: Any) -> None:
    c = make_cluster()
    c.job("job", {"n1": (0,)}, step=47)
    t = c.clock.t
    c.event(
        "n1",
        "checkpoint",
        ts=t - 30,
        job="job",
        rank=0,
        data={"phase": "save_end", "step": 40, "ok": True},
    )
    c.event(
        "n1",
        "checkpoint",
        ts=t - 5,
        job="job",
        rank=0,
        data={"phase": "save_end", "step": 45, "ok": False},
    )
    c.event("n1", "exception", ts=t, job="job", rank=0, data={"step": 47})
    c.clock.advance(0.25)
    c.decide()
    (inc,) = c.incidents("job")
    assert (inc["trigger"], inc["triggered_by"], inc["fault_step"], inc["lost_steps"]) == (
        "auto",
        "engine",
        47,
        7,  # the failed save at 45 does not count
    )
    tl = inc["timeline"]
    assert tl["fault_at"] == t and tl["decided_at"] == c.clock.t
    assert tl["detected_at"] is not None  # the backend's receive time
    (cmd,) = inc["commands"]
    c.clock.advance(0.1)
    c.ack(cmd["id"], "n1", "delivered")
    c.clock.advance(0.5)
    c.ack(cmd["id"], "n1", "torn_down", "restarted")
    c.clock.advance(1.0)
    c.ack(cmd["id"], "n1", "resumed")
    inc = c.incidents("job")[0]
    tl = inc["timeline"]
    assert tl["delivered_at"] < tl["torn_down_at"] == tl["restarted_at"] < tl["resumed_at"]
    assert inc["status"] == "resolved" and inc["recovery_s"] == tl["resumed_at"] - t


def test_a_launcher_restart_done_before_the_command_arrived_keeps_its_timeline(
    make_cluster: Any,
) -> None:
    """CI (the warm pool under torchrun): the launcher restarted the workers 0.4 s after
    a SIGKILL, before the engine's command reached the agent 0.5 s after it; the agent
    reported the launcher's own times ("already restarted"), earlier than its delivery,
    so none fitted the timeline and the incident resolved with no recovery time."""
    c = make_cluster()
    c.job("job", {"n1": (0, 1)})
    t = c.clock.t
    c.event("n1", "rank_exit", ts=t, job="job", rank=1, data={"signal": 9, "clean": False})
    c.decide()
    (cmd,) = c.incidents("job")[0]["commands"]

    def ack(phase: str, ts: float) -> None:
        body = {"phase": phase, "ts": ts, "node": "n1", "detail": "already restarted"}
        r = c.client.post(f"/api/v1/commands/{cmd['id']}/acks", json=body)
        assert r.status_code == 200, r.text

    ack("delivered", t + 0.52)
    ack("torn_down", t + 0.43)
    ack("restarted", t + 0.44)
    ack("resumed", t + 0.50)
    inc = c.incidents("job")[0]
    tl = inc["timeline"]
    assert inc["status"] == "resolved", inc
    assert (tl["torn_down_at"], tl["restarted_at"], tl["resumed_at"]) == (
        t + 0.43,
        t + 0.44,
        t + 0.5,
    )
    assert tl["delivered_at"] is None  # the delivery did not bring the restart
    assert inc["recovery_s"] == tl["resumed_at"] - t
    assert "delivered" in {a["phase"] for a in inc["commands"][0]["acks"]}  # kept there


def test_resumed_is_derived_from_steps_when_the_ack_is_missing(make_cluster: Any) -> None:
    c = make_cluster()
    t = c.clock.t
    earlier = [
        wire.StepReport(job="job", rank=0, step=n, start=t - 48 + n, end=t - 47 + n)
        for n in range(47)
    ]
    c.post("n1", steps=earlier)
    c.job("job", {"n1": (0,)}, step=47)
    c.event("n1", "exception", job="job", rank=0, data={"step": 47})
    c.decide()
    (cmd,) = c.incidents("job")[0]["commands"]
    c.ack(cmd["id"], "n1", "delivered")  # ... and the agent is never heard of again
    end = c.clock.advance(3)
    c.post(
        "n1",
        steps=[wire.StepReport(job="job", rank=0, step=45, start=end - 0.5, end=end, iteration=1)],
    )
    c.clock.advance(3)
    c.decide()
    inc = c.incidents("job")[0]
    assert inc["status"] == "resolved" and inc["timeline"]["resumed_at"] == end
    assert "from the job's steps" in inc["outcome"]
    assert inc["lost_steps"] == 3  # steps 45..47 done again


def test_a_silent_node_hosting_live_ranks_is_excluded(make_cluster: Any) -> None:
    down_after = 20.0  # TRAINGUARD_NODE_DOWN_AFTER_S
    c = make_cluster(fresh=down_after)
    c.job("job", {"n1": (0,), "n2": (1,)})
    c.post("idle")  # a node with no ranks goes silent too
    c.decide()  # the engine starts to listen (a backend that just started)
    t = c.clock.t
    for node in ("n1", "idle"):
        c.heard(node, t - down_after - 1)
    c.decide()
    # Every agent looks silent right after a backend outage: not judged before the
    # engine itself has listened for the threshold.
    assert c.incidents("job") == []
    c.clock.advance(down_after)
    c.heard("n2", c.clock.t)  # n2 kept reporting
    c.decide()
    (inc,) = c.incidents("job")
    assert (inc["cause"], inc["level"], inc["node"]) == ("node_down", "exclude_node", "n1")
    assert [(x["node"], x["action"]) for x in inc["commands"]] == [("n2", "launcher")]
    assert c.client.get("/api/v1/nodes/idle").json()["cordoned"] is False
    c.decide()  # the same silence is evidence once
    assert len(c.incidents("job")[0]["evidence"]) == 1
    with c.engine.sessions() as s:
        audit = s.scalars(select(AuditLog).where(AuditLog.action == "cordon")).all()
    assert [(a.actor, a.target) for a in audit] == [("engine", "node:n1")]


def test_exclude_node_runs_the_cordon_hook_then_restarts_without_the_node(
    make_cluster: Any,
) -> None:
    hook = sys.executable + """ -c "print('cordoned {node} for {job} incident {incident}')" """
    c = make_cluster("[hooks]\ncordon = '''" + hook + "'''\n")
    c.job("job", {"n1": (0,), "n2": (1,)})
    c.event("n1", "xid", xid=79)
    c.decide()
    # n1 leaves the job at once; the restart of the others waits for the cordon hook.
    commands = c.incidents("job")[0]["commands"]
    assert [(x["node"], x["action"]) for x in commands] == [("n1", "exclude_node")]

    def restarted() -> Any:
        c.decide()
        inc = c.incidents("job")[0]
        return inc if len(inc["commands"]) > 1 else None

    inc = wait_for(restarted)
    (run,) = inc["hooks"]
    assert run["ok"] and run["output"].strip() == f"cordoned n1 for job incident {inc['id']}"
    assert [(x["node"], x["action"]) for x in inc["commands"]] == [
        ("n1", "exclude_node"),
        ("n2", "launcher"),
    ]


def test_evidence_without_a_job_to_act_on_opens_no_incident(make_cluster: Any) -> None:
    c = make_cluster()
    c.event("n9", "xid", xid=79)  # no ranks on the node
    c.event("n1", "exception", job="unknown-job", rank=0)
    c.event("n1", "rank_exit", job="unknown-job", rank=0)
    c.job("done", {"n1": (0,)})
    c.event("n1", "rank_exit", job="done", rank=0, data={"exit_code": 0, "clean": True})
    c.event("n1", "exception", ts=c.clock.t - 3600, job="done", rank=0)  # replayed, stale
    c.decide()
    assert c.incidents() == []
    counts = c.engine.status()["counts"]
    assert counts["no_job"] == 3 and counts["stale"] == 1
