"""Goodput stops with the job (issue #33 item 4): after a job's end (finished), its stop
(stop_job) or while it waits for capacity, reading its goodput later gives the same
figure; only a running job's clock runs on. Hand-checked cases through the ingest, the
engine and GET /api/v1/jobs/{job}/goodput; the engine tests' clock is the backend's
(`time` in analytics.service too, tests/backend/engine/conftest.py), so "later" needs no
sleep.

Each job: 2 ranks on n1, registered at t0, ten 1 s steps t0 .. t0+10 (productive 10 s).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.backend.engine.conftest import Cluster
from trainguard.protocol import wire

TOL = 1e-6
RANKS = (0, 1)


def _ranks(job: str, alive: bool = True) -> list[wire.RankStatus]:
    return [
        wire.RankStatus(job=job, rank=r, pid=1000 + r, world_size=2, alive=alive) for r in RANKS
    ]


def _train(c: Cluster, job: str) -> float:
    """Register the ranks at t0 and report ten 1 s steps; the clock ends at t0 + 10."""
    t0 = c.clock.t
    starts = [wire.Event(kind="rank_start", ts=t0, job=job, rank=r) for r in RANKS]
    c.post("n1", ranks=_ranks(job), events=starts)
    c.clock.advance(10)
    steps = [
        wire.StepReport(job=job, rank=r, step=n, start=t0 + n, end=t0 + n + 1)
        for n in range(10)
        for r in RANKS
    ]
    c.post("n1", ranks=_ranks(job), steps=steps)
    return t0


def _later(c: Cluster, job: str, s: float, alive: bool = True) -> None:
    """`s` seconds pass while the node's agent goes on reporting the job's ranks."""
    c.clock.advance(s)
    c.post("n1", ranks=_ranks(job, alive))
    c.decide()


def _goodput(c: Cluster, job: str) -> dict[str, Any]:
    r = c.client.get(f"/api/v1/jobs/{job}/goodput", params={"window": "all"})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    assert body["productive_s"] + sum(body["badput"].values()) == pytest.approx(
        body["elapsed_s"], abs=1e-4
    )
    return body


def _state(c: Cluster, job: str) -> dict[str, Any]:
    body: dict[str, Any] = c.client.get(f"/api/v1/jobs/{job}").json()
    return body


def test_a_running_jobs_goodput_is_accounted_up_to_now(make_cluster: Any) -> None:
    c: Cluster = make_cluster()
    t0 = _train(c, "job")
    c.decide()
    assert _state(c, "job")["state"] == "running"
    first = _goodput(c, "job")
    # 10 s elapsed, all of it steps.
    assert first["until"] == pytest.approx(t0 + 10)
    assert first["productive_s"] == pytest.approx(10.0, abs=TOL)
    assert first["goodput"] == pytest.approx(1.0, abs=TOL)
    _later(c, "job", 10)  # alive, no step: its clock runs on (it has no end)
    second = _goodput(c, "job")
    # 20 s elapsed: 10 productive, 10 after the last step that nothing covers ("other").
    assert second["until"] == pytest.approx(t0 + 20)
    assert second["badput"]["other"] == pytest.approx(10.0, abs=TOL)
    assert second["goodput"] == pytest.approx(10 / 20, abs=TOL)


def test_a_finished_jobs_goodput_stops_at_its_end(make_cluster: Any) -> None:
    c: Cluster = make_cluster()
    t0 = _train(c, "job")
    end = t0 + 10.5
    exits = [
        wire.Event(kind="rank_exit", ts=end, job="job", rank=r, data={"exit_code": 0})
        for r in RANKS
    ]
    c.clock.advance(1)
    c.post("n1", ranks=_ranks("job", alive=False), events=exits)
    _later(c, "job", 10, alive=False)
    job = _state(c, "job")
    assert job["state"] == "finished" and job["ended_at"] == pytest.approx(end)
    first = _goodput(c, "job")
    # 10.5 s: ten steps, then 0.5 s to the exits ("other").
    assert first["until"] == pytest.approx(end)
    assert first["elapsed_s"] == pytest.approx(10.5, abs=TOL)
    assert first["badput"]["other"] == pytest.approx(0.5, abs=TOL)
    assert first["goodput"] == pytest.approx(10 / 10.5, abs=TOL)
    _later(c, "job", 10, alive=False)
    assert _goodput(c, "job") == first


STOP_ON_EXCEPTION = """
[causes]
exception = "stop_job"
[limits]
cooldown_s = 0
"""


def test_a_stopped_jobs_goodput_stops_at_the_stop(make_cluster: Any) -> None:
    c: Cluster = make_cluster(STOP_ON_EXCEPTION)
    t0 = _train(c, "job")
    fault = t0 + 10.3
    c.clock.advance(0.5)  # the agent sends it at t0 + 10.5, the engine decides at t0 + 11
    c.event("n1", "exception", ts=fault, job="job", rank=0, message="RuntimeError: boom")
    c.clock.advance(0.5)
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["level"] == "stop_job"
    job = _state(c, "job")
    assert job["state"] == "stopped" and job["ended_at"] is None
    stop = job["state_since"]
    assert stop == pytest.approx(t0 + 11)
    first = _goodput(c, "job")
    # Up to the stop, 11 s: steps 10, then 0.3 s to the fault ("other") and the stop's
    # incident from the fault to the stop, 0.7 s of recovery.
    assert first["until"] == pytest.approx(stop)
    assert first["badput"]["other"] == pytest.approx(0.3, abs=1e-4)
    assert first["badput"]["recovery"] == pytest.approx(0.7, abs=1e-4)
    assert first["goodput"] == pytest.approx(10 / 11, abs=1e-5)
    _later(c, "job", 10)  # its ranks still report, nothing restarts it
    assert _state(c, "job")["state"] == "stopped"
    assert _goodput(c, "job") == first  # before: recovery to now, 10 / 21 and falling


def test_a_waiting_jobs_goodput_does_not_move_while_it_waits(make_cluster: Any) -> None:
    c: Cluster = make_cluster()
    t0 = _train(c, "job")
    fault = t0 + 10.2
    c.clock.advance(0.5)  # sent at t0 + 10.5
    c.event("n1", "xid", ts=fault, xid=79, gpu_uuid="GPU-n1-0")
    for _ in range(3):  # exclude n1, its only node: the job waits for capacity
        c.decide()
        c.clock.advance(5)
    job = _state(c, "job")
    assert job["state"] == "waiting"
    waited_from = job["state_since"]
    assert t0 + 10.2 < waited_from < c.clock.t
    first = _goodput(c, "job")
    # Steps 10; 0.2 s to the fault ("other"); the incident's recovery from the fault to
    # the wait; from there to now `waiting`, which is not the job's time:
    # goodput = 10 / (elapsed - waiting) = 10 / (waited_from - t0).
    assert first["until"] == pytest.approx(c.clock.t)
    assert first["badput"]["other"] == pytest.approx(0.2, abs=1e-4)
    assert first["badput"]["recovery"] == pytest.approx(waited_from - fault, abs=1e-4)
    assert first["badput"]["waiting"] == pytest.approx(c.clock.t - waited_from, abs=1e-4)
    assert first["goodput"] == pytest.approx(10 / (waited_from - t0), abs=1e-5)
    _later(c, "job", 10)
    assert _state(c, "job")["state"] == "waiting"
    second = _goodput(c, "job")
    assert second["goodput"] == pytest.approx(first["goodput"], abs=1e-9)
    assert second["badput"]["recovery"] == pytest.approx(first["badput"]["recovery"], abs=1e-6)
    assert second["badput"]["waiting"] == pytest.approx(first["badput"]["waiting"] + 10, abs=1e-4)


def test_a_waiting_job_that_trained_on_and_exited_stops_at_its_last_step(make_cluster: Any) -> None:
    # The other job: set waiting while its ranks trained on, then it completed
    # cleanly; the time after its last step counted as recovery and goodput fell to 0.25.
    c: Cluster = make_cluster()
    t0 = _train(c, "job")
    fault = t0 + 10.2
    c.clock.advance(0.5)
    c.event("n1", "xid", ts=fault, xid=79, gpu_uuid="GPU-n1-0")
    for _ in range(3):
        c.decide()
        c.clock.advance(5)
    assert _state(c, "job")["state"] == "waiting"
    steps = [  # steps 10..19, t0+10 .. t0+20, then every rank exits 0
        wire.StepReport(job="job", rank=r, step=n, start=t0 + n, end=t0 + n + 1)
        for n in range(10, 20)
        for r in RANKS
    ]
    exits = [
        wire.Event(kind="rank_exit", ts=t0 + 20.5, job="job", rank=r, data={"exit_code": 0})
        for r in RANKS
    ]
    c.post("n1", ranks=_ranks("job", alive=False), steps=steps, events=exits)
    first = _goodput(c, "job")
    # The job's time is t0 .. t0+20 (its last step); waiting from there. The XID's
    # incident has no resumed_at: its recovery runs from the fault to the end of the
    # first step that ends after it (t0+10.2 .. t0+11, taken from step 10).
    # Step 10 keeps 0.2 s, so the ideal step is the mean of 19 x 1 s and 0.2 s = 0.96 s;
    # each 1 s step gives 0.96 productive and 0.04 straggler:
    # productive = 19 x 0.96 + 0.2 = 18.44, straggler 0.76; goodput = 18.44 / 20.
    assert first["ideal_step_s"] == pytest.approx(0.96, abs=1e-5)
    assert first["badput"]["recovery"] == pytest.approx(0.8, abs=1e-4)
    assert first["badput"]["straggler"] == pytest.approx(0.76, abs=1e-4)
    assert first["badput"]["waiting"] == pytest.approx(c.clock.t - (t0 + 20), abs=1e-4)
    assert first["productive_s"] == pytest.approx(18.44, abs=1e-4)
    assert first["goodput"] == pytest.approx(18.44 / 20, abs=1e-5)
    # The engine then sees the job ended (issue #33 item 1): its waiting incident closes
    # (nothing to restart) and the job is finished at its ranks' exit, t0+20.5: the
    # 0.5 s from its last step to the exit is the job's time (other), nothing waits.
    _later(c, "job", 10, alive=False)
    assert _state(c, "job")["state"] == "finished"
    (inc,) = c.incidents("job")
    assert inc["status"] == "resolved" and "the job ended while it waited" in inc["outcome"]
    ended = _goodput(c, "job")
    assert ended["elapsed_s"] == pytest.approx(20.5, abs=1e-4)
    assert ended["badput"]["waiting"] == 0
    assert ended["goodput"] == pytest.approx(18.44 / 20.5, abs=1e-5)
    _later(c, "job", 10, alive=False)
    assert _goodput(c, "job")["goodput"] == pytest.approx(ended["goodput"], abs=1e-9)
