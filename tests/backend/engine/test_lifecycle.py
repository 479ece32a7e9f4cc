"""Lifecycles: a cordoned node comes back (readmission) unless it is flagged for repair;
a job is finished when its ranks exit 0 and its goodput stops there; a job says what it
can carry out and a restart it cannot is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainguard.backend.engine.policy import PolicyError, load_policy
from trainguard.protocol import wire

READMIT = "[readmission]\nreadmit_after_s = 30\n"


def _gpu(c: Any, node: str, lost: bool) -> None:
    uuid = f"GPU-{node}-0"
    sample = (
        wire.GpuSample(uuid=uuid, ts=c.clock.t)  # every reading missing: fallen off the bus
        if lost
        else wire.GpuSample(uuid=uuid, ts=c.clock.t, util=0.0, temp_c=31.0, power_w=60.0)
    )
    c.post(node, gpus=[wire.GpuInfo(uuid=uuid, index=0)], samples=[sample])


def test_a_node_is_readmitted_after_its_simulated_reboot(make_cluster: Any) -> None:
    c = make_cluster(READMIT)
    c.job("job", {"n1": (0,), "n2": (1,)})
    _gpu(c, "n1", lost=False)
    c.event("n1", "xid", xid=79, gpu_uuid="GPU-n1-0")
    _gpu(c, "n1", lost=True)
    c.decide()
    node = c.client.get("/api/v1/nodes/n1").json()
    assert node["cordoned"] is True and node["cordon"]["by"] == "engine"
    assert "xid 79" in node["cordon"]["evidence"]
    # Lost until the (simulated) reboot 20 s later; healthy from then on.
    for _ in range(4):
        c.clock.advance(5)
        _gpu(c, "n1", lost=True)
        c.decide()
    for _ in range(5):
        c.clock.advance(5)
        _gpu(c, "n1", lost=False)
        c.decide()
        assert c.client.get("/api/v1/nodes/n1").json()["cordoned"] is True  # < 30 s healthy
    c.clock.advance(6)
    _gpu(c, "n1", lost=False)
    c.decide()
    node = c.client.get("/api/v1/nodes/n1").json()
    assert node["cordoned"] is False and node["cordon"] is None
    (h,) = c.client.get("/api/v1/nodes/n1/cordons").json()
    assert h["by"] == "engine" and h["released_by"] == "engine"
    assert "healthy for 30 s" in h["release_reason"]


def test_a_node_cordoned_again_and_again_is_flagged_for_repair(make_cluster: Any) -> None:
    c = make_cluster(READMIT)
    c.post("n1")  # the node, before the job (an operator's cordon of live ranks needs force)
    for _ in range(2):
        assert c.client.post("/api/v1/nodes/n1/cordon", json={"reason": "flaky"}).status_code == 200
        assert c.client.post("/api/v1/nodes/n1/uncordon", json={}).status_code == 200
    c.job("job", {"n1": (0,), "n2": (1,)})
    _gpu(c, "n1", lost=False)
    c.event("n1", "xid", xid=79, gpu_uuid="GPU-n1-0")
    c.decide()
    for _ in range(10):
        c.clock.advance(10)
        _gpu(c, "n1", lost=False)
        c.decide()
    node = c.client.get("/api/v1/nodes/n1").json()
    assert node["cordoned"] is True and node["repair"] is True and node["cordons_recent"] == 3
    assert len(c.client.get("/api/v1/nodes/n1/cordons").json()) == 3


def test_readmitting_an_unknown_node_is_a_404(client: Any) -> None:
    r = client.post("/api/v1/nodes/no-such-node/uncordon", json={"reason": "x"})
    assert r.status_code == 404 and "no-such-node" in r.json()["detail"]


def test_a_policy_key_out_of_range_is_refused_with_its_key_and_line(tmp_path: Path) -> None:
    p = tmp_path / "policy.toml"
    p.write_text("[breaker]\nmax_fraction = 1.5\n")
    with pytest.raises(PolicyError, match=r"breaker\.max_fraction \(line 2\)"):
        load_policy(p)
    p.write_text("[causes]\nexception = 'exclude_node'\n")
    with pytest.raises(PolicyError, match=r"causes\.exception"):
        load_policy(p)


def test_a_job_whose_ranks_exit_0_is_finished_and_its_goodput_stops_there(
    make_cluster: Any,
) -> None:
    c = make_cluster()
    c.job("job", {"n1": (0, 1)})
    c.decide()
    assert c.client.get("/api/v1/jobs/job").json()["state"] == "running"
    c.clock.advance(1)
    end = c.exited("n1", "job", (0, 1))
    c.decide()
    assert c.incidents("job") == []  # normal exits are no fault
    c.clock.advance(10)
    c.decide()
    job = c.client.get("/api/v1/jobs/job").json()
    assert job["state"] == "finished" and job["ended_at"] == pytest.approx(end)
    g = c.client.get("/api/v1/jobs/job/goodput", params={"window": "all"}).json()
    assert g["until"] == pytest.approx(end)


STOP_AT_ONCE = """
[escalation]
window_s = 600
in_process = 1
launcher = 1
[limits]
cooldown_s = 0
"""


def test_a_job_given_up_on_trains_on_and_ends_when_its_ranks_do(make_cluster: Any) -> None:
    # The demo, watched for an hour: stop_job ended the job's goodput at the decision
    # while it trained on for minutes, and it stayed "stopped" after it finished.
    c = make_cluster(STOP_AT_ONCE)
    c.job("job", {"n1": (0, 1)})
    for _ in range(3):  # in_process, launcher, then stop_job
        c.clock.advance(30)
        c.event("n1", "exception", job="job", rank=0, message="RuntimeError: boom")
        c.decide()
        c.recover()
    assert [i["level"] for i in c.incidents("job")] == ["in_process", "launcher", "stop_job"]
    c.clock.advance(30)
    c.job("job", {"n1": (0, 1)}, step=200)  # its ranks step on
    c.decide()
    job = c.client.get("/api/v1/jobs/job").json()
    assert job["state"] == "stopped" and job["ended_at"] is None  # goodput runs on
    c.clock.advance(1)
    end = c.exited("n1", "job", (0, 1))
    c.clock.advance(10)
    c.decide()
    job = c.client.get("/api/v1/jobs/job").json()
    assert job["state"] == "finished" and job["ended_at"] == pytest.approx(end)


def test_an_unclean_exit_is_a_fault_whatever_it_says(make_cluster: Any) -> None:
    c = make_cluster()
    c.job("job", {"n1": (0, 1)})
    c.event("n1", "rank_exit", job="job", rank=1, data={"exit_code": 1, "clean": True})
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["cause"] == "rank_exit" and inc["level"] == "launcher"


def _declare(c: Any, node: str, in_process: bool, launcher: str) -> None:
    c.post(
        node,
        ranks=[
            wire.RankStatus(
                job="job",
                rank=r,
                pid=1000 + r,
                world_size=2,
                in_process=in_process,
                launcher=launcher,
            )
            for r in (0, 1)
        ],
    )


def test_in_process_needs_every_rank_under_the_wrapper(make_cluster: Any) -> None:
    c = make_cluster()
    c.job("job", {"n1": (0, 1)})
    _declare(c, "n1", in_process=False, launcher="torchrun")
    caps = c.client.get("/api/v1/jobs/job").json()["capabilities"]
    assert caps == {"in_process": False, "launchers": ["torchrun"], "levels": ["launcher"]}
    body = {"level": "in_process", "reason": "try it"}
    r = c.client.post("/api/v1/jobs/job/restarts", json=body)
    assert r.status_code == 409 and "Wrapper" in r.json()["detail"]
    assert c.incidents("job") == []  # nothing changed
    r = c.client.post("/api/v1/jobs/job/restarts", json={"level": "reboot", "reason": "x"})
    assert r.status_code == 422
    # The engine picks launcher for an exception of such a job.
    c.event("n1", "exception", job="job", rank=0, message="RuntimeError: boom")
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["level"] == "launcher"
    assert "not every live rank runs under NVRx's Wrapper" in inc["decisions"][-1]["why"]


def test_a_wrapped_job_gets_in_process(make_cluster: Any) -> None:
    c = make_cluster()
    c.job("job", {"n1": (0, 1)})
    _declare(c, "n1", in_process=True, launcher="ft_launcher")
    c.event("n1", "exception", job="job", rank=0, message="RuntimeError: boom")
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["level"] == "in_process"


def test_a_job_finishes_while_an_exclusion_waits_for_an_operator(make_cluster: Any) -> None:
    # bench chaos: a breaker-held exclusion kept its finished job "running" forever.
    c = make_cluster("[limits]\ncooldown_s = 0\n")
    c.job("job", {"n1": (0,), "n2": (1,), "n3": (2,)})
    c.event("n1", "xid", xid=79, gpu_uuid="GPU-n1-0")
    c.decide()
    c.recover()
    c.clock.advance(1)
    c.event("n2", "xid", xid=79, gpu_uuid="GPU-n2-0")
    c.decide()
    assert [i["status"] for i in c.incidents("job")] == ["resolved", "pending"]
    c.clock.advance(1)
    for node, r in (("n1", 0), ("n2", 1), ("n3", 2)):
        c.post(
            node,
            ranks=[wire.RankStatus(job="job", rank=r, pid=1000 + r, alive=False)],
            events=[
                wire.Event(
                    kind="rank_exit",
                    ts=c.clock.t,
                    job="job",
                    rank=r,
                    data={"exit_code": 0, "clean": True},
                )
            ],
        )
    c.clock.advance(10)
    c.decide()
    assert c.client.get("/api/v1/jobs/job").json()["state"] == "finished"
    held = c.incidents("job")[1]
    assert held["status"] == "pending"  # the node's case waits, about the node only
    assert held["decisions"][-1]["mode"] == "node_only", held["decisions"]
    assert "approving now cordons n2 only" in held["outcome"], held
    # Approved: n2 is cordoned and nothing is sent to the ended job.
    r = c.client.post(f"/api/v1/incidents/{held['id']}/approve", json={"reason": "bad GPU"})
    assert r.status_code in (200, 202), r.text
    c.decide()
    held = c.incidents("job")[1]
    assert held["status"] == "resolved", held
    assert "cordoned n2; the job had finished: nothing is restarted" in held["outcome"], held
    assert c.client.get("/api/v1/nodes/n2").json()["cordoned"] is True
    assert c.commands("n1") == [] and c.commands("n3") == []


def test_a_job_is_finished_although_its_agent_goes_on_reporting_the_exited_ranks(
    make_cluster: Any,
) -> None:
    # bench chaos: finished jobs read "running" for 1-2 minutes, because the agents keep
    # sending the exited ranks' status and the end was taken from its report time.
    c = make_cluster()
    c.job("job", {"n1": (0, 1)})
    end = c.exited("n1", "job", (0, 1))
    gone = [wire.RankStatus(job="job", rank=r, pid=1000 + r, alive=False) for r in (0, 1)]
    for _ in range(4):
        c.clock.advance(2)
        c.post("n1", ranks=gone)  # the agent reports them again, as it does
        c.decide()
    job = c.client.get("/api/v1/jobs/job").json()
    assert job["state"] == "finished" and job["ended_at"] == pytest.approx(end)


def test_a_job_whose_agent_was_away_at_its_end_ends_as_its_seen_ranks_did(
    make_cluster: Any,
) -> None:
    # bench chaos (#33, A): n2's agent was stopped while the job finished; its ranks'
    # exits went unseen and the job read `running` for the rest of the run.
    c = make_cluster()
    c.job("job", {"n1": (0, 1), "n2": (2, 3)})
    c.clock.advance(1)
    end = c.exited("n1", "job", (0, 1))
    _gpu(c, "n2", lost=False)  # a batch with no rank list says nothing of n2's ranks
    c.clock.advance(20)
    c.post("n2", ranks=[])  # n2's agent is back, knowing none of them
    c.decide()
    assert c.client.get("/api/v1/jobs/job").json()["state"] == "running"  # not yet: 30 s
    c.clock.advance(15)
    c.post("n2", ranks=[])
    c.decide()
    job = c.client.get("/api/v1/jobs/job").json()
    assert job["state"] == "finished", job
    assert "rank 2, 3: exit unseen" in job["state_reason"], job
    assert job["ended_at"] == pytest.approx(end)
    assert c.incidents("job") == []


def test_a_job_whose_every_exit_went_unseen_fails_saying_how_is_unknown(
    make_cluster: Any,
) -> None:
    c = make_cluster()
    c.job("job", {"n1": (0, 1)})
    c.clock.advance(31)
    c.post("n1", ranks=[])  # its agent restarted; the ranks ended meanwhile
    c.decide()
    assert c.client.get("/api/v1/jobs/job").json()["state"] == "running"  # the launcher's wait
    c.clock.advance(130)
    c.post("n1", ranks=[])
    c.decide()
    job = c.client.get("/api/v1/jobs/job").json()
    assert job["state"] == "failed" and "how is unknown" in job["state_reason"], job


def test_a_rank_that_re_registers_after_its_agent_restarts_stays_alive(
    make_cluster: Any,
) -> None:
    c = make_cluster()
    c.job("job", {"n1": (0, 1)})
    c.clock.advance(31)
    c.post("n1", ranks=[wire.RankStatus(job="job", rank=0, pid=1000, last_step=10)])
    c.clock.advance(1)
    c.post("n1", ranks=[wire.RankStatus(job="job", rank=r, pid=1000 + r) for r in (0, 1)])
    c.clock.advance(40)
    c.post("n1", ranks=[wire.RankStatus(job="job", rank=r, pid=1000 + r) for r in (0, 1)])
    c.decide()
    job = c.client.get("/api/v1/jobs/job").json()
    assert job["state"] == "running" and len(job["ranks"]) == 2, job
    assert all(r["alive"] for r in job["ranks"]), job["ranks"]
