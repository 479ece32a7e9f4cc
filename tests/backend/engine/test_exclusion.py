"""An exclusion takes the node out of the job (engine.actions `_leave`, incidents.acks
`record_leave`): an exclude_node command to the node's agent beside the launcher restart
of the job's other nodes; its acks say when and how the node left, and the resolution
names the node that took its place."""

from __future__ import annotations

from typing import Any

from trainguard.protocol import wire


def _excluded(c: Any) -> tuple[dict[str, Any], dict[str, str]]:
    c.job("job", {"n1": (0, 1), "n2": (2, 3)})
    c.event("n1", "xid", xid=79, gpu_uuid="GPU-n1-0")
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["level"] == "exclude_node"
    return inc, {x["action"]: x["id"] for x in inc["commands"]}


def test_the_excluded_node_leaves_and_the_spare_that_took_its_place_is_named(
    make_cluster: Any,
) -> None:
    c = make_cluster()
    inc, ids = _excluded(c)
    assert sorted(ids) == ["exclude_node", "launcher"]
    (leave,) = [x for x in c.commands("n1") if x["action"] == "exclude_node"]
    assert leave["params"]["grace_s"] == 30  # the policy's leave_grace_s
    assert [x["action"] for x in c.commands("n2")] == ["launcher"]
    c.ack(ids["exclude_node"], "n1", "delivered", "torn_down", detail="ended pid 4242 with SIGTERM")
    # Its workers' exits say the exclusion ended them: no new fault.
    tag = f"exclude_node {ids['exclude_node']}"
    c.post(
        "n1",
        ranks=[wire.RankStatus(job="job", rank=r, pid=1000 + r, alive=False) for r in (0, 1)],
        events=[
            wire.Event(
                kind="rank_exit",
                ts=c.clock.t,
                job="job",
                rank=r,
                data={"exit_code": -15, "signal": 15, "signalled_by": tag},
            )
            for r in (0, 1)
        ],
    )
    c.clock.advance(2)
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["status"] == "open"
    assert inc["decisions"][-1]["leave"] == "n1 left: ended pid 4242 with SIGTERM"
    assert inc["decisions"][-1]["left_at"] is not None
    # The spare n3 joins the re-formed round with ranks 0 and 1; n2's restart resumes.
    c.post(
        "n3",
        ranks=[
            wire.RankStatus(job="job", rank=r, pid=3000 + r, world_size=4, last_step=11)
            for r in (0, 1)
        ],
        events=[wire.Event(kind="rank_start", ts=c.clock.t, job="job", rank=r) for r in (0, 1)],
    )
    c.ack(ids["launcher"], "n2", "delivered", "torn_down", "restarted", "resumed")
    (inc,) = c.incidents("job")
    assert inc["status"] == "resolved"
    assert inc["outcome"] == "resumed; n3 took the place of n1"


def test_a_node_that_did_not_leave_is_said_and_the_restart_goes_on(make_cluster: Any) -> None:
    c = make_cluster()
    inc, ids = _excluded(c)
    c.ack(ids["exclude_node"], "n1", "delivered", "failed", detail="not permitted to signal pid 1")
    (inc,) = c.incidents("job")
    assert inc["status"] == "open"
    assert inc["outcome"] == "n1 did not leave the job: not permitted to signal pid 1"
    assert inc["decisions"][-1]["leave"] == "n1 did not leave: not permitted to signal pid 1"
    c.ack(ids["launcher"], "n2", "delivered", "torn_down", "restarted", "resumed")
    (inc,) = c.incidents("job")
    assert inc["status"] == "resolved" and inc["outcome"] == "resumed without n1"


def test_the_only_node_of_a_job_keeps_its_launcher(make_cluster: Any) -> None:
    # Ending it would end the job for good (trainguard starts no launcher): the job waits
    # for the node's readmission instead (test_do_no_harm's only-node test goes on there).
    c = make_cluster()
    c.job("job", {"n1": (0,), "n2": (1,)})
    c.job("other", {"n3": (0,)})
    c.event("n3", "xid", xid=79, gpu_uuid="GPU-n3-0")
    c.decide()
    (inc,) = c.incidents("other")
    assert inc["level"] == "exclude_node"
    assert [x["action"] for x in inc["commands"]] == []
    assert inc["decisions"][-1]["leave"] == "n3 is the only node of job other: its launcher stays"


def test_a_spare_reported_after_the_first_step_is_named_once_it_is(make_cluster: Any) -> None:
    # The survivors' first step can reach the backend before the spare's agent reports
    # its ranks: the outcome says "resumed without n1" until their rank_start events come.
    c = make_cluster()
    inc, ids = _excluded(c)
    c.ack(ids["exclude_node"], "n1", "delivered", "torn_down", detail="ended pid 1 with SIGTERM")
    c.ack(ids["launcher"], "n2", "delivered", "torn_down", "restarted", "resumed")
    (inc,) = c.incidents("job")
    assert (inc["status"], inc["outcome"]) == ("resolved", "resumed without n1")
    c.post(
        "n3",
        ranks=[wire.RankStatus(job="job", rank=r, pid=3000 + r, world_size=4) for r in (0, 1)],
        events=[wire.Event(kind="rank_start", ts=c.clock.t, job="job", rank=r) for r in (0, 1)],
    )
    c.clock.advance(1)
    c.decide()
    (inc,) = c.incidents("job")
    assert (inc["status"], inc["outcome"]) == ("resolved", "resumed; n3 took the place of n1")


def test_an_operators_cordon_of_a_node_with_live_ranks_asks_for_force_then_excludes_it(
    make_cluster: Any,
) -> None:
    c = make_cluster()
    c.job("job", {"n1": (0, 1), "n2": (2, 3)})
    r = c.client.post("/api/v1/nodes/n1/cordon", json={"reason": "fan failing"})
    assert r.status_code == 409, r.text
    assert r.json()["code"] == "live_ranks"
    assert "n1 hosts live ranks of job job (rank 0, 1)" in r.json()["detail"]
    assert c.client.get("/api/v1/nodes/n1").json()["cordoned"] is False
    assert c.incidents("job") == []
    r = c.client.post("/api/v1/nodes/n1/cordon", json={"reason": "fan failing", "force": True})
    assert r.status_code == 200, r.text
    (opened,) = r.json()["incidents"]
    assert c.client.get("/api/v1/nodes/n1").json()["cordoned"] is True
    (inc,) = c.incidents("job")
    assert inc["id"] == opened
    assert (inc["trigger"], inc["cause"], inc["level"]) == ("manual", "operator", "exclude_node")
    assert sorted((x["node"], x["action"]) for x in inc["commands"]) == [
        ("n1", "exclude_node"),
        ("n2", "launcher"),
    ]
    assert inc["decisions"][-1]["leave"] == "n1 leaves job job: its launcher is ended"
    # Carried out as the engine's exclusion: the node leaves, the others resume.
    ids = {x["action"]: x["id"] for x in inc["commands"]}
    c.ack(ids["exclude_node"], "n1", "delivered", "torn_down", detail="ended pid 7 with SIGTERM")
    c.ack(ids["launcher"], "n2", "delivered", "torn_down", "restarted", "resumed")
    (inc,) = c.incidents("job")
    assert (inc["status"], inc["outcome"]) == ("resolved", "resumed without n1")
    # A second cordon changes nothing and needs no force.
    r = c.client.post("/api/v1/nodes/n1/cordon", json={"reason": "again"})
    assert r.status_code == 200 and r.json()["changed"] is False and r.json()["incidents"] == []


def test_a_node_whose_agent_is_silent_while_its_ranks_train_still_hosts_the_job(
    make_cluster: Any,
) -> None:
    # n2's agent stopped a minute ago (a restart, an upgrade) and its ranks train on
    # unheard: the job is not n1's alone, so n1 leaves it when its GPU falls off the bus
    # (kept, its launcher would rejoin every round on a node that cannot train).
    c = make_cluster(fresh=15.0)
    c.job("job", {"n1": (0, 1), "n2": (2, 3)})
    c.clock.advance(60)
    c.heard("n1", c.clock.t)
    c.event("n1", "xid", xid=79, gpu_uuid="GPU-n1-0")
    c.decide()
    (inc,) = [i for i in c.incidents("job") if i["cause"] == "xid 79"]
    assert inc["level"] == "exclude_node"
    assert inc["decisions"][-1]["leave"] == "n1 leaves job job: its launcher is ended"
    assert [x["action"] for x in c.commands("n1")] == ["exclude_node"]
    # The restart waits for n2's agent (durable): the job has capacity there, it does
    # not wait for any.
    assert [x["action"] for x in c.commands("n2")] == ["launcher"]
    assert inc["job_state"] != "waiting", inc
