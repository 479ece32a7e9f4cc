"""Goodput stops with the job (issue #33 item 4): after a job's end (finished), its stop
(stop_job) or while it waits for capacity, reading its goodput later gives the same
figure; only a running job's clock runs on. Hand-checked cases through the ingest, the
engine and GET /api/v1/jobs/{job}/goodput; the test clock is the backend's (`time` in
analytics.service, as in the ingest), so "later" needs no sleep.

Each job: 2 ranks on n1, registered at t0, ten 1 s steps t0 .. t0+10 (productive 10 s).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.backend.engine.conftest import Cluster, _ClockTime
from trainguard.backend.analytics import service as analytics_service
from trainguard.protocol import wire

TOL = 1e-6
RANKS = (0, 1)


@pytest.fixture
def cluster(make_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(policy: str = "") -> Cluster:
        c: Cluster = make_cluster(policy)
        monkeypatch.setattr(analytics_service, "time", _ClockTime(c.clock))
        return c

    return make


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


def test_a_running_jobs_goodput_is_accounted_up_to_now(cluster: Any) -> None:
    c = cluster()
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


def test_a_finished_jobs_goodput_stops_at_its_end(cluster: Any) -> None:
    c = cluster()
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


def test_a_stopped_jobs_goodput_stops_at_the_stop(cluster: Any) -> None:
    c = cluster(STOP_ON_EXCEPTION)
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


def test_a_waiting_jobs_goodput_does_not_move_while_it_waits(cluster: Any) -> None:
    c = cluster()
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
