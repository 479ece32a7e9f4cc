"""Do no harm: a node is cordoned only on evidence about its hardware, automatic cordons
are capped by the breaker, a job left without nodes waits, and a fault after a
resumption is an incident of its own."""

from __future__ import annotations

from typing import Any

from trainguard.protocol import wire


def test_a_failed_launcher_restart_on_a_one_node_job_never_cordons_it(make_cluster: Any) -> None:
    c = make_cluster("[escalation]\nrelaunch_wait_s = 0\n")
    c.job("job", {"n1": (0, 1)})
    c.event("n1", "rank_exit", job="job", rank=1, data={"exit_code": 1})
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["level"] == "launcher"
    (cmd,) = inc["commands"]
    c.ack(cmd["id"], "n1", "delivered", "failed", detail="gloo: Connection refused")
    c.decide()  # the failure climbs: launcher -> stop_job, never exclude_node
    (inc,) = c.incidents("job")
    assert inc["status"] == "stopped" and inc["level"] == "stop_job"
    assert "no more automatic restarts" in inc["outcome"]
    node = c.client.get("/api/v1/nodes/n1").json()
    assert node["cordoned"] is False and node["cordon"] is None
    assert c.client.get("/api/v1/nodes/n1/cordons").json() == []


def test_three_xid_79s_on_8_nodes_give_2_cordons_and_1_pending(make_cluster: Any) -> None:
    # (The ladder would stop the job after 2 exclusions: this is about the breaker.)
    c = make_cluster("[limits]\ncooldown_s = 0\n[escalation]\nexclude_node = 10\n")
    nodes = [f"n{i}" for i in range(8)]
    c.job("job", {node: (i,) for i, node in enumerate(nodes)})
    for node in nodes[:3]:
        c.clock.advance(1)
        c.event(node, "xid", xid=79, gpu_uuid=f"GPU-{node}-0")
        c.decide()
    incs = c.incidents("job")
    assert [i["node"] for i in incs] == ["n0", "n1", "n2"]  # three faults, three incidents
    assert [i["status"] for i in incs] == ["open", "open", "pending"]
    cordoned = [n["name"] for n in c.client.get("/api/v1/nodes").json() if n["cordoned"]]
    assert cordoned == ["n0", "n1"]  # max(1, 25 % of 8)
    held = incs[2]
    assert "breaker" in held["outcome"] and held["decisions"][-1]["mode"] == "breaker"
    assert held["commands"] == []
    # An operator approves it: the exclusion is carried out.
    r = c.client.post(f"/api/v1/incidents/{held['id']}/approve", json={"reason": "checked"})
    assert r.status_code == 202, r.text
    c.clock.advance(5)  # (the approval is stamped with the server's real clock)
    c.decide()
    node = c.client.get("/api/v1/nodes/n2").json()
    assert node["cordoned"] is True and node["cordon"]["incident_id"] == held["id"]
    (held,) = [i for i in c.incidents("job") if i["id"] == held["id"]]
    assert held["status"] == "open"
    restarted = {x["node"] for x in held["commands"] if x["action"] == "launcher"}
    assert restarted == set(nodes) - {"n2"}
    # n2 leaves the job: its agent ends the job's launcher there.
    assert [x["node"] for x in held["commands"] if x["action"] == "exclude_node"] == ["n2"]


def test_an_xid_after_an_exception_that_resumed_is_a_new_incident(make_cluster: Any) -> None:
    # Demo incident #2: an XID 79 5 s after an exception NVRx had already recovered was
    # merged into it (cause "xid 79", reason "exception", resumed before decided).
    c = make_cluster()
    c.job("job", {"n1": (0,), "n2": (1,)})
    c.event("n1", "exception", job="job", rank=0, message="RuntimeError: boom")
    c.decide()
    assert c.recover() == 2
    c.clock.advance(5)
    c.event("n1", "xid", xid=79, gpu_uuid="GPU-n1-0")
    c.decide()
    first, second = c.incidents("job")
    assert (first["cause"], first["status"]) == ("exception", "resolved")
    assert [e["kind"] for e in first["evidence"]] == ["exception"]
    assert (second["cause"], second["level"], second["node"]) == ("xid 79", "exclude_node", "n1")


def test_another_nodes_xid_during_an_open_incident_is_its_own(make_cluster: Any) -> None:
    c = make_cluster()
    c.job("job", {"n1": (0,), "n2": (1,)})
    c.event("n1", "exception", job="job", rank=0, message="RuntimeError: boom")
    c.decide()
    c.clock.advance(1)
    c.event("n2", "xid", xid=79, gpu_uuid="GPU-n2-0")
    c.decide()
    first, second = c.incidents("job")
    assert first["cause"] == "exception" and first["node"] == "n1"
    assert second["cause"] == "xid 79" and second["node"] == "n2"


def _steps(
    c: Any, node: str, job: str, ranks: tuple[int, ...], step: int, gen: tuple[int, int]
) -> None:
    t = c.clock.t
    c.post(
        node,
        steps=[
            wire.StepReport(
                job=job, rank=r, step=step, start=t - 0.2, end=t, attempt=gen[0], iteration=gen[1]
            )
            for r in ranks
        ],
        ranks=[
            wire.RankStatus(
                job=job,
                rank=r,
                pid=1000 + r,
                world_size=2,
                attempt=gen[0],
                iteration=gen[1],
                last_step=step,
            )
            for r in ranks
        ],
    )


def test_a_deferred_incident_whose_job_restarted_by_itself_sends_nothing(
    make_cluster: Any,
) -> None:
    # Inside the cooldown an exception waits; NVRx's Wrapper restarts the job meanwhile.
    c = make_cluster("[limits]\ncooldown_s = 10\n")
    c.job("job", {"n1": (0, 1)})
    c.event("n1", "exception", job="job", rank=0, message="RuntimeError: one")
    c.decide()
    c.recover()
    c.clock.advance(3)
    c.event("n1", "exception", job="job", rank=1, message="RuntimeError: two")
    c.decide()
    second = c.incidents("job")[1]
    assert second["status"] == "open" and second["commands"] == []  # waiting: cooldown
    c.clock.advance(1.5)
    _steps(c, "n1", "job", (0, 1), 11, (0, 1))  # a new Wrapper iteration made a step
    c.clock.advance(10)
    c.decide()
    second = c.incidents("job")[1]
    assert second["status"] == "resolved" and second["commands"] == []
    assert "recovered by itself" in second["outcome"]
    t = second["timeline"]
    assert t["decided_at"] is None and t["fault_at"] <= t["detected_at"] <= t["resumed_at"]


def test_an_xid_on_the_only_node_makes_the_job_wait_not_fail(make_cluster: Any) -> None:
    c = make_cluster()
    c.job("job", {"n1": (0, 1)})
    c.event("n1", "xid", xid=79, gpu_uuid="GPU-n1-0")
    for _ in range(3):
        c.decide()
        c.clock.advance(5)
    (inc,) = c.incidents("job")
    assert inc["status"] == "open" and inc["outcome"].startswith("waiting: no schedulable node")
    assert inc["commands"] == []
    job = c.client.get("/api/v1/jobs/job").json()
    assert job["state"] == "waiting"
    # The node is readmitted by an operator: the job restarts on it.
    r = c.client.post("/api/v1/nodes/n1/uncordon", json={"reason": "GPU replaced"})
    assert r.status_code == 200, r.text
    c.decide()
    (inc,) = c.incidents("job")
    assert [(x["node"], x["action"]) for x in inc["commands"]] == [("n1", "launcher")]
    assert c.client.get("/api/v1/jobs/job").json()["state"] == "restarting"
    history = c.client.get("/api/v1/nodes/n1/cordons").json()
    assert [(h["by"], h["released_by"]) for h in history] == [("engine", "test-admin")] or (
        history[0]["by"] == "engine" and history[0]["released_at"] is not None
    )


def test_a_job_with_ranks_on_a_cordoned_node_is_still_restarted_there(make_cluster: Any) -> None:
    # Cordon means no new work: the ranks still running there are live ranks of the job.
    c = make_cluster()
    c.job("job", {"n1": (0,), "n2": (1,)})
    r = c.client.post("/api/v1/nodes/n1/cordon", json={"reason": "maintenance tonight"})
    assert r.status_code == 200
    c.event("n2", "rank_exit", job="job", rank=1, data={"exit_code": 1, "signal": 9})
    c.decide()
    (inc,) = c.incidents("job")
    assert sorted((x["node"], x["action"]) for x in inc["commands"]) == [
        ("n1", "launcher"),
        ("n2", "launcher"),
    ]
    assert inc["status"] == "open"


def test_a_node_without_the_workers_does_not_fail_an_action_the_others_carry_out(
    make_cluster: Any,
) -> None:
    # bench chaos: n2's agent had just restarted and did not know its ranks yet; its
    # "no live rank" failed the incident, which climbed to stop_job in 0.4 s while the
    # job resumed on n1's restart 12 s later.
    c = make_cluster()
    c.job("job", {"n1": (0, 1), "n2": (2, 3)})
    c.event("n1", "rank_exit", job="job", rank=0, data={"signal": 9})
    c.decide()
    (inc,) = c.incidents("job")
    cmds = {x["node"]: x["id"] for x in inc["commands"]}
    c.ack(cmds["n2"], "n2", "delivered", "failed", detail="no live rank of job job on this node")
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["status"] == "open" and inc["level"] == "launcher"
    c.clock.advance(5)
    c.ack(cmds["n1"], "n1", "delivered", "torn_down", "restarted", "resumed")
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["status"] == "resolved" and inc["outcome"] == "resumed"
    assert c.client.get("/api/v1/jobs/job").json()["state"] != "stopped"


def test_a_node_that_never_acks_resumed_does_not_keep_the_incident_open(
    make_cluster: Any,
) -> None:
    # bench chaos: one node acked resumed, the other (its agent restarted meanwhile)
    # never did; the incident stayed open for good while the job trained on.
    c = make_cluster()
    c.job("job", {"n1": (0,), "n2": (1,)})
    c.event("n1", "rank_exit", job="job", rank=0, data={"signal": 9})
    c.decide()
    (inc,) = c.incidents("job")
    cmds = {x["node"]: x["id"] for x in inc["commands"]}
    c.clock.advance(5)
    c.ack(cmds["n2"], "n2", "delivered", "torn_down")
    for node, r in (("n1", 0), ("n2", 1)):
        _steps(c, node, "job", (r,), 11, (1, 0))  # the new attempt trains
    c.ack(cmds["n1"], "n1", "delivered", "torn_down", "restarted", "resumed")
    c.decide()
    assert c.incidents("job")[0]["status"] == "open"  # n2's ack may still come
    c.clock.advance(11)
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["status"] == "resolved" and "never acked resumed" in inc["outcome"]
