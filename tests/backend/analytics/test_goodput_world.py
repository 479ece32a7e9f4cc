"""Goodput at a changed world size (issue #35 item 2, docs/goodput.md `reduced_world`).

A 4-rank job on two nodes (WORLD_SIZE 4) trains 20 steps of 1 s; an XID excludes its
second node and the elastic job re-forms on the first with WORLD_SIZE 2 (torchrun
--nnodes 1:2), resuming from memory at step 20. Times are offsets from T0 (s):

    0-1 ....... job start (rank_start, world 4) -> first step    initialization  1
    1-21 ...... steps 0..19 at world 4                             productive     20
    21.2 ...... fault; the two ranks left register at 25 (world 2)
    21-26 ..... the gap between the generations and the incident   recovery        5
    26-46 ..... steps 20..39 at world 2: half of each is productive productive     10
                                                                   reduced_world  10
    elapsed 46; goodput = 30 / 46

With a hot spare the job re-forms at world 4 and the same times give 40 / 46: the
spare's steps are whole.
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
UNTIL = T0 + 46
FAULT = T0 + 21.2
TOL = 1e-4


def _steps() -> list[tuple[int, int, float, float, int]]:
    """(rank, step, start, end, iteration): ranks 0-3 before the fault, 0-1 after."""
    out = [(r, n, T0 + 1 + n, T0 + 2 + n, 0) for n in range(20) for r in range(4)]
    out += [(r, n, T0 + 6 + n, T0 + 7 + n, 1) for n in range(20, 40) for r in range(2)]
    return out


def _worlds(after: int) -> list[tuple[float, int]]:
    return [(T0, 4)] * 4 + [(T0 + 25, after)] * 2


def _account(after: int) -> Any:
    cohort: dict[tuple[int, int], CohortStep] = {}
    for _, n, a, b, it in _steps():
        cohort[(it, n)] = CohortStep(0, it, n, a, b)
    return account(
        list(cohort.values()),
        job_start=T0,
        first_step_start=T0 + 1,
        since=T0,
        until=UNTIL,
        incidents=[(FAULT, T0 + 27)],
        worlds=_worlds(after),
    )


def test_steps_at_a_smaller_world_are_productive_at_their_size() -> None:
    acc = _account(after=2)
    assert acc.productive_s == pytest.approx(30.0, abs=TOL)
    assert acc.badput["reduced_world"] == pytest.approx(10.0, abs=TOL)
    assert acc.badput["recovery"] == pytest.approx(5.0, abs=TOL)
    assert acc.badput["initialization"] == pytest.approx(1.0, abs=TOL)
    assert acc.productive_s + sum(acc.badput.values()) == pytest.approx(46.0, abs=TOL)
    assert acc.goodput == pytest.approx(30 / 46, abs=1e-6)
    # the bars carry the bucket too, and add up to the totals
    assert sum(b["reduced_world"] for b in acc.series) == pytest.approx(10.0, abs=TOL)
    assert sum(b["productive_s"] for b in acc.series) == pytest.approx(30.0, abs=TOL)


def test_a_spare_that_keeps_the_world_whole_loses_nothing_to_it() -> None:
    acc = _account(after=4)
    assert acc.badput["reduced_world"] == 0.0
    assert acc.productive_s == pytest.approx(40.0, abs=TOL)


def _post(client: Any, seq: int, node: str, **kw: Any) -> None:
    batch = wire.Batch(node=node, agent_id=f"agent-{node}", seq=seq, sent_at=time.time(), **kw)
    r = client.post("/api/v1/ingest", content=wire.encode(batch))
    assert r.status_code == 200, r.text


def test_the_goodput_route_reads_the_world_from_the_rank_registrations(
    client: Any, db_url: str
) -> None:
    job = "shrunk"

    def start(ts: float, rank: int, world: int) -> wire.Event:
        data = {"world_size": world, "local_rank": rank % 2}
        return wire.Event(kind="rank_start", ts=ts, job=job, rank=rank, data=data)

    _post(client, 1, "w-n0", events=[start(T0, 0, 4), start(T0, 1, 4)])
    _post(client, 1, "w-n1", events=[start(T0, 2, 4), start(T0, 3, 4)])
    _post(client, 2, "w-n0", events=[start(T0 + 25, 0, 2), start(T0 + 25, 1, 2)])
    reports = [
        wire.StepReport(job=job, rank=r, step=n, start=a, end=b, iteration=it)
        for r, n, a, b, it in _steps()
    ]
    for i in range(0, len(reports), 40):
        _post(client, 3 + i // 40, "w-n0", steps=reports[i : i + 40])
    engine = create_engine(db_url)
    with Session(engine) as s:
        s.add(
            Incident(
                job_id=s.scalar(select(Job.id).where(Job.name == job)),
                created_at=FAULT + 0.2,
                trigger="auto",
                triggered_by="engine",
                cause="xid 79",
                level="exclude_node",
                status="resolved",
                fault_at=FAULT,
                fault_attempt=0,
                fault_iteration=0,
                resumed_at=T0 + 27,
            )
        )
        s.commit()
    engine.dispose()
    r = client.get(f"/api/v1/jobs/{job}/goodput", params={"window": "all", "until": UNTIL})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["elapsed_s"] == pytest.approx(46.0, abs=TOL)
    assert body["badput"]["reduced_world"] == pytest.approx(10.0, abs=TOL)
    assert body["productive_s"] == pytest.approx(30.0, abs=TOL)
    assert body["goodput"] == pytest.approx(30 / 46, abs=1e-6)
