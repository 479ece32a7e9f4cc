"""The step that resumes training after a restart is productive work: an incident's
recovery ends where that step starts, not at `resumed_at` (its end). Issue #32 item 5.

A 2-rank job, 1 s steps, an in-process restart that resumes from a checkpoint. Times are
offsets from T0 (s); the cohort step is rank 0's (rank 1 may start each step `lag` later
and end `early` sooner):

    0 ......... job start (rank_start)                         initialization  2
    2-22 ...... iteration 0: steps 0..19, 1 s each
    22-23 ..... blocking save of step 19                       checkpoint_save 1
    23-33 ..... steps 20..29, redone after the restart         wasted_progress 10
    33.3 ...... fault (an exception on rank 1 in step 30)
    33.5-33.8 . restore of step 19's checkpoint                checkpoint_restore 0.3
    33.8-53.8 . iteration 1: steps 20..39 from the checkpoint
                the first one, 33.8-34.8, resumed training: productive
    recovery: 33 -> 33.8 (the gap after step 29 and the fault) less the restore = 0.5
    productive: 20 steps of iteration 0 + 20 of iteration 1 = 40
    elapsed 53.8 = 2 + 1 + 10 + 0.3 + 0.5 + 40; goodput = 40 / 53.8 = 0.74349 (74.35 %)

Counting the resuming step as recovery (recovery to resumed_at = 34.8) moves 1 s from
productive to recovery: 39 / 53.8 = 0.72491 (72.49 %), the figure of the issue.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from trainguard.backend.analytics.goodput import CohortStep, account
from trainguard.backend.models import Incident, Job
from trainguard.protocol import wire

T0 = float(int(time.time()) // 3600 * 3600 - 86400)  # a fixed hour a day ago
UNTIL = T0 + 53.8
FAULT = T0 + 33.3
RESUMED_STEP = (T0 + 33.8, T0 + 34.8)  # the first step after the restart (cohort)
EXPECTED = {
    "initialization": 2.0,
    "checkpoint_save": 1.0,
    "checkpoint_restore": 0.3,
    "recovery": 0.5,
    "wasted_progress": 10.0,
    "straggler": 0.0,
    "other": 0.0,
}
EXPECTED_PRODUCTIVE = 40.0
EXPECTED_GOODPUT = 40.0 / 53.8  # 0.743494...
TOL = 1e-4  # seconds; timestamps near 1.8e9 s carry ~2e-7 s of float noise

# (rank, step, start, end, iteration)
Steps = list[tuple[int, int, float, float, int]]


def build(lag: float, early: float) -> Steps:
    """Both ranks' step reports; rank 1 starts `lag` after rank 0 and ends `early` before."""
    cohort: list[tuple[int, float, int]] = []  # (step, start, iteration)
    cohort += [(n, T0 + 2 + n, 0) for n in range(20)]
    cohort += [(n, T0 + 23 + (n - 20), 0) for n in range(20, 30)]  # after the save
    cohort += [(n, T0 + 33.8 + (n - 20), 1) for n in range(20, 40)]  # from step 19's ckpt
    out: Steps = []
    for n, a, it in cohort:
        out.append((0, n, a, a + 1.0, it))
        out.append((1, n, a + lag, a + 1.0 - early, it))
    return out


def first_end_after_restart(steps: Steps) -> float:
    """`resumed_at` as the engine records it: the end of the first step row of the new
    iteration to end (analytics.repository.recovered_by_itself / first_step_after)."""
    return min(end for _, _, start, end, it in steps if it == 1 and start >= FAULT)


# --- the pure accounting ---------------------------------------------------------------


def test_the_resuming_step_is_productive_in_the_pure_accounting() -> None:
    # Ranks in lock-step: resumed_at is the cohort step's end, 34.8. The recovery bench
    # (backend/bench/recovery_analysis.py) passes incidents to account() this way.
    steps = build(lag=0.0, early=0.0)
    resumed = first_end_after_restart(steps)
    assert resumed == pytest.approx(RESUMED_STEP[1], abs=TOL)
    cohort: dict[tuple[int, int], CohortStep] = {}
    for _, n, a, b, it in steps:
        c = cohort.get((it, n))
        lo, hi = (a, b) if c is None else (min(a, c.start), max(b, c.end))
        cohort[(it, n)] = CohortStep(0, it, n, lo, hi)
    acc = account(
        list(cohort.values()),
        job_start=T0,
        first_step_start=T0 + 2,
        since=T0,
        until=UNTIL,
        saves=[(T0 + 22, T0 + 23)],
        restores=[(T0 + 33.5, T0 + 33.8)],
        incidents=[(FAULT, resumed)],
    )
    for bucket, seconds in EXPECTED.items():
        assert acc.badput[bucket] == pytest.approx(seconds, abs=TOL), bucket
    assert acc.productive_s == pytest.approx(EXPECTED_PRODUCTIVE, abs=TOL)
    assert acc.goodput == pytest.approx(EXPECTED_GOODPUT, abs=1e-6)  # not 39 / 53.8


# --- through the real ingest and the goodput route ----------------------------------------


def _post(client: Any, seq: int, **kw: Any) -> None:
    batch = wire.Batch(node="n1", agent_id="agent-resume-1", seq=seq, sent_at=time.time(), **kw)
    r = client.post("/api/v1/ingest", content=wire.encode(batch))
    assert r.status_code == 200, r.text


def _ingest(client: Any, db_url: str, job: str, steps: Steps) -> None:
    """What the agent sends (rank registrations, checkpoint events, step reports in
    batches), and the incident as the engine stores it for an in-process restart that
    NVRx's Wrapper made by itself."""
    ranks = [
        wire.RankStatus(job=job, rank=r, pid=100 + r, local_rank=r, world_size=2) for r in (0, 1)
    ]
    events = [wire.Event(kind="rank_start", ts=T0, job=job, rank=r) for r in (0, 1)]
    checkpoints = ((T0 + 23, "save_end", 19, 1.0), (T0 + 33.8, "restore_end", 19, 0.3))
    for ts, phase, step, blocking in checkpoints:
        for r in (0, 1):
            data = {"phase": phase, "step": step, "blocking_s": blocking}
            events.append(wire.Event(kind="checkpoint", ts=ts, job=job, rank=r, data=data))
    _post(client, 1, ranks=ranks, events=events)
    reports = [
        wire.StepReport(job=job, rank=r, step=n, start=a, end=b, iteration=it)
        for r, n, a, b, it in steps
    ]
    for i in range(0, len(reports), 40):
        _post(client, 2 + i // 40, ranks=ranks, steps=reports[i : i + 40])
    engine = create_engine(db_url)
    with Session(engine) as s:
        job_id = s.scalar(select(Job.id).where(Job.name == job))
        s.add(
            Incident(
                job_id=job_id,
                created_at=FAULT + 0.2,
                trigger="auto",
                triggered_by="engine",
                cause="exception",
                level="in_process",
                status="resolved",
                fault_at=FAULT,
                fault_attempt=0,
                fault_iteration=0,
                resumed_at=first_end_after_restart(steps),
            )
        )
        s.commit()
    engine.dispose()


@pytest.mark.parametrize(("lag", "early"), [(0.0, 0.0), (0.25, 0.1)], ids=["lockstep", "skewed"])
def test_the_resuming_step_is_productive_through_the_api(
    client: Any, db_url: str, lag: float, early: float
) -> None:
    # Skewed: rank 1's first step after the restart, 34.05-34.7, ends first, so the
    # engine's resumed_at is 34.7; the cohort step it belongs to runs 33.8-34.8.
    steps = build(lag, early)
    _ingest(client, db_url, "resume", steps)
    r = client.get("/api/v1/jobs/resume/goodput", params={"window": "all", "until": UNTIL})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["elapsed_s"] == pytest.approx(53.8, abs=TOL)
    for bucket, seconds in EXPECTED.items():
        assert body["badput"][bucket] == pytest.approx(seconds, abs=TOL), bucket
    assert body["productive_s"] == pytest.approx(EXPECTED_PRODUCTIVE, abs=TOL)
    assert body["goodput"] == pytest.approx(EXPECTED_GOODPUT, abs=1e-6)
    assert body["ideal_step_s"] == pytest.approx(1.0, abs=TOL)
    assert (body["productive_steps"], body["wasted_steps"]) == (40, 10)
