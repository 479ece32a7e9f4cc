"""Goodput accounting: exact buckets for a run with two incidents and a rollback, through
the pure function and through the real ingest + API on both databases."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from tests.backend.analytics import scenario
from tests.backend.analytics.scenario import EXPECTED, EXPECTED_PRODUCTIVE, T0, UNTIL
from tests.support import wait_for
from trainguard.backend.analytics.goodput import BUCKETS, CohortStep, account, ideal_step_time
from trainguard.backend.models import Incident, Job
from trainguard.protocol import wire

TOL = 1e-3


def cohort(run: scenario.Run) -> list[CohortStep]:
    agg: dict[tuple[int, int, int], list[float]] = {}
    for _rank, step, start, end, att, it in run.steps:
        a = agg.setdefault((att, it, step), [start, end])
        a[0], a[1] = min(a[0], start), max(a[1], end)
    return [CohortStep(att, it, s, a, b) for (att, it, s), (a, b) in agg.items()]


def spans(run: scenario.Run, phase: str) -> list[tuple[float, float]]:
    return [(ts - b, ts) for ts, p, _, b in run.checkpoints if p == f"{phase}_end"]


def run_account(run: scenario.Run, since: float, until: float, points: int = 24) -> Any:
    steps = cohort(run)
    return account(
        steps,
        job_start=run.job_start,
        first_step_start=min(s.start for s in steps),
        since=since,
        until=until,
        saves=spans(run, "save"),
        restores=spans(run, "restore"),
        # resumed_at as recorded: account() ends the recovery where the resuming step starts.
        incidents=[(f, resumed) for f, resumed, _, _ in run.incidents],
        points=points,
    )


def test_two_incidents_and_a_rollback_give_the_exact_buckets() -> None:
    acc = run_account(scenario.build(), T0, UNTIL)
    assert acc.elapsed_s == pytest.approx(400.0)
    for bucket, seconds in EXPECTED.items():
        assert acc.badput[bucket] == pytest.approx(seconds, abs=TOL), bucket
    assert acc.productive_s == pytest.approx(EXPECTED_PRODUCTIVE, abs=TOL)
    assert acc.goodput == pytest.approx(EXPECTED_PRODUCTIVE / 400.0, abs=1e-5)
    assert acc.ideal_step_s == pytest.approx(1.0, abs=1e-6)
    assert acc.wasted_steps == 50
    assert [d.covered_by_incident for d in acc.disruptions] == [True, True]


def test_buckets_and_bars_add_up_to_the_elapsed_time() -> None:
    acc = run_account(scenario.build(), T0, UNTIL, points=7)
    assert acc.productive_s + sum(acc.badput.values()) == pytest.approx(acc.elapsed_s, abs=1e-6)
    assert len(acc.series) == 7
    for bar in acc.series:
        assert bar["productive_s"] + sum(bar[b] for b in BUCKETS) == pytest.approx(bar["dt"])
    for b in BUCKETS:
        assert sum(bar[b] for bar in acc.series) == pytest.approx(acc.badput[b], abs=1e-6)


def test_windows_add_up_to_the_whole_run() -> None:
    run = scenario.build()
    whole = run_account(run, T0, UNTIL)
    cut = T0 + 170.25  # inside the first recovery
    first, second = run_account(run, T0, cut), run_account(run, cut, UNTIL)
    assert second.since == cut and second.elapsed_s == pytest.approx(UNTIL - cut)
    for b in BUCKETS:
        assert first.badput[b] + second.badput[b] == pytest.approx(whole.badput[b], abs=TOL), b
    assert first.productive_s + second.productive_s == pytest.approx(whole.productive_s, abs=TOL)


def test_a_restart_without_incident_is_recovery_from_the_step_gap() -> None:
    steps = [CohortStep(0, 0, n, 10.0 + n, 11.0 + n) for n in range(10)]  # ends at 20
    steps += [CohortStep(1, 0, n, 30.0 + n - 5, 31.0 + n - 5) for n in range(5, 15)]  # from 30
    acc = account(steps, job_start=10.0, first_step_start=10.0, since=10.0, until=40.0)
    assert acc.badput["recovery"] == pytest.approx(10.0)  # 20 -> 30
    assert acc.badput["wasted_progress"] == pytest.approx(5.0)  # steps 5..9 redone
    assert acc.productive_s == pytest.approx(15.0)
    assert [d.covered_by_incident for d in acc.disruptions] == [False]


def test_a_job_without_steps_is_all_initialization() -> None:
    acc = account([], job_start=100.0, first_step_start=None, since=0.0, until=160.0)
    assert acc.since == 100.0 and acc.elapsed_s == 60.0
    assert acc.badput["initialization"] == 60.0 and acc.goodput == 0.0


def test_ideal_step_time_ignores_outliers_beyond_three_mads() -> None:
    times = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 10.0]
    assert ideal_step_time(times) == pytest.approx(1.0)
    assert ideal_step_time([]) is None


# --- through the real ingest and API ------------------------------------------------------------


def _post(client: Any, node: str, seq: int, **kw: Any) -> None:
    batch = wire.Batch(node=node, agent_id="agent-goodput-1", seq=seq, sent_at=time.time(), **kw)
    r = client.post("/api/v1/ingest", content=wire.encode(batch))
    assert r.status_code == 200, r.text


def _ingest_scenario(client: Any, db_url: str, job: str = "gp") -> None:
    run = scenario.build()
    ranks = [
        wire.RankStatus(job=job, rank=r, pid=100 + r, local_rank=r, world_size=2, attempt=1)
        for r in (0, 1)
    ]
    events = [wire.Event(kind="rank_start", ts=T0, job=job, rank=r) for r in (0, 1)]
    for ts, phase, step, b in run.checkpoints:
        for r, shift in ((0, 0.0), (1, 0.1)):
            data: dict[str, Any] = {"phase": phase, "step": step, "blocking_s": b - 2 * shift}
            events.append(wire.Event(kind="checkpoint", ts=ts - shift, job=job, rank=r, data=data))
    steps = [
        wire.StepReport(job=job, rank=r, step=s, start=a, end=b, attempt=att, iteration=it)
        for r, s, a, b, att, it in run.steps
    ]
    _post(client, "n1", 1, ranks=ranks, events=events)
    for i in range(0, len(steps), 200):
        _post(client, "n1", 2 + i // 200, steps=steps[i : i + 200], ranks=ranks)
    engine = create_engine(db_url)
    with Session(engine) as s:
        job_id = s.scalar(select(Job.id).where(Job.name == job))
        for fault, resumed, level, _began in run.incidents:
            s.add(
                Incident(
                    job_id=job_id,
                    created_at=fault + 1,
                    trigger="auto",
                    triggered_by="engine",
                    cause="rank_exit",
                    level=level,
                    status="resolved",
                    fault_at=fault,
                    resumed_at=resumed,
                )
            )
        s.commit()
    engine.dispose()


def test_goodput_api_reports_the_exact_buckets(client: Any, db_url: str) -> None:
    _ingest_scenario(client, db_url)
    r = client.get("/api/v1/jobs/gp/goodput", params={"window": "all", "until": UNTIL})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["job"] == "gp" and body["window"] == "all"
    assert body["since"] == pytest.approx(T0) and body["until"] == pytest.approx(UNTIL)
    assert body["elapsed_s"] == pytest.approx(400.0)
    for bucket, seconds in EXPECTED.items():
        assert body["badput"][bucket] == pytest.approx(seconds, abs=TOL), bucket
    assert body["productive_s"] == pytest.approx(EXPECTED_PRODUCTIVE, abs=TOL)
    assert body["goodput"] == pytest.approx(0.625, abs=1e-5)
    assert len(body["series"]) == 24
    bar = body["series"][0]
    assert {"t", "dt", "goodput", "productive_s", *BUCKETS} <= set(bar)
    # The 1 h window of a 400 s run is the whole run; a later `until` adds idle time.
    hour = client.get("/api/v1/jobs/gp/goodput", params={"window": "1h", "until": UNTIL}).json()
    assert hour["badput"] == pytest.approx(body["badput"])
    later = client.get("/api/v1/jobs/gp/goodput", params={"window": "24h", "until": UNTIL + 100})
    assert later.json()["badput"]["other"] == pytest.approx(112.0, abs=TOL)
    assert client.get("/api/v1/jobs/gp/goodput", params={"window": "7d"}).status_code == 422
    assert client.get("/api/v1/jobs/nope/goodput").status_code == 404


def test_goodput_gauge_on_metrics(make_client: Any, db_url: str) -> None:
    client = make_client(analytics_interval_s=0.1, goodput_refresh_s=0.1)
    _ingest_scenario(client, db_url, job="gauged")

    def gauge() -> str | None:
        text = client.get("/metrics").text
        line = next(
            (
                x
                for x in text.splitlines()
                if x.startswith('trainguard_job_goodput_ratio{job="gauged"')
            ),
            None,
        )
        return line

    line = wait_for(gauge, 20)
    assert 0 < float(line.rsplit(" ", 1)[1]) < 1
    text = client.get("/metrics").text
    assert 'trainguard_job_stragglers{job="gauged"} 0.0' in text
    assert 'trainguard_job_badput_seconds{bucket="wasted_progress",job="gauged"}' in text
