"""The reads analytics needs: cohort steps, checkpoint spans, incidents, rank placement,
new step rows for the straggler detector, persisted straggler flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, func, or_, select
from sqlalchemy.orm import Session

from trainguard.backend.analytics.goodput import CohortStep
from trainguard.backend.models import Event, Gpu, Incident, Job, Node, Rank, Step

_MAX_BLOCKING_S = 3600.0  # a checkpoint event ending this long after `until` is ignored


@dataclass(frozen=True, slots=True)
class Placement:
    rank: int
    node: str
    node_id: int
    local_rank: int
    gpu_uuid: str | None


def cohort_steps(
    session: Session,
    job_id: int,
    since: float,
    until: float | None,
    ended_by: float | None = None,
) -> list[CohortStep]:
    """One row per (attempt, iteration, step) that ends at or after `since` and starts by
    `until` (None: any time): the earliest rank's start and the slowest rank's end. Plus
    the last step that ended before `since`, so the window's first step knows where it
    began. `ended_by`: of the rows that ended by then only (a span long past, read
    without scanning the (job_id, end) index to the job's newest step)."""
    stmt = select(
        Step.attempt, Step.iteration, Step.step, func.min(Step.start), func.max(Step.end)
    ).where(Step.job_id == job_id, Step.end >= since)
    if until is not None:
        stmt = stmt.where(Step.start <= until)
    if ended_by is not None:
        stmt = stmt.where(Step.end <= ended_by)
    rows = session.execute(stmt.group_by(Step.attempt, Step.iteration, Step.step)).all()
    out = [CohortStep(a, i, s, start, end) for a, i, s, start, end in rows]
    prev = session.execute(
        select(Step.attempt, Step.iteration, Step.step, Step.start, Step.end)
        .where(Step.job_id == job_id, Step.end < since)
        .order_by(Step.end.desc())
        .limit(1)
    ).first()
    if prev is not None:
        keys = {(c.attempt, c.iteration, c.step) for c in out}
        if (prev[0], prev[1], prev[2]) not in keys:
            out.append(CohortStep(*prev))
    return out


def first_step_start(session: Session, job_id: int) -> float | None:
    first_end = session.scalar(select(func.min(Step.end)).where(Step.job_id == job_id))
    if first_end is None:
        return None
    # The first step's earliest rank: rows ending within a minute of the first end.
    return session.scalar(
        select(func.min(Step.start)).where(Step.job_id == job_id, Step.end <= first_end + 60)
    )


def job_start(session: Session, job: Job, first_start: float | None) -> float:
    """The earliest of: first rank registration, first step start, the job's first batch."""
    registered = session.scalar(
        select(func.min(Event.ts)).where(Event.kind == "rank_start", Event.job == job.name)
    )
    return min(x for x in (registered, first_start, job.first_seen) if x is not None)


def world_sizes(session: Session, job: str, until: float) -> list[tuple[float, int]]:
    """(ts, world size) of the job's rank registrations up to `until`, oldest first: the
    WORLD_SIZE each rank started with (rank_start events that say it)."""
    rows = session.execute(
        select(Event.ts, Event.data)
        .where(Event.kind == "rank_start", Event.job == job, Event.ts <= until)
        .order_by(Event.ts)
    )
    out = []
    for ts, data in rows:
        w = (data or {}).get("world_size")
        if isinstance(w, int) and not isinstance(w, bool) and w >= 1:
            out.append((ts, w))
    return out


def last_activity(session: Session, job_id: int) -> float | None:
    return session.scalar(select(func.max(Step.end)).where(Step.job_id == job_id))


def checkpoint_events(
    session: Session, job: str, since: float | None = None, until: float | None = None
) -> list[tuple[float, dict[str, Any], int | None]]:
    """(ts, data, rank) of the job's checkpoint events, oldest first."""
    stmt = select(Event.ts, Event.data, Event.rank).where(
        Event.kind == "checkpoint", Event.job == job
    )
    if since is not None:
        stmt = stmt.where(Event.ts >= since)
    if until is not None:
        stmt = stmt.where(Event.ts <= until + _MAX_BLOCKING_S)
    return [(ts, data or {}, rank) for ts, data, rank in session.execute(stmt.order_by(Event.ts))]


def blocking_spans(
    events: list[tuple[float, dict[str, Any], int | None]], phase: str
) -> list[tuple[float, float]]:
    """[ts - blocking_s, ts] of every `<phase>_end` event (save or restore)."""
    out = []
    for ts, data, _ in events:
        if data.get("phase") != f"{phase}_end":
            continue
        b = data.get("blocking_s")
        if isinstance(b, int | float) and b > 0:
            out.append((ts - float(b), ts))
    return out


def incidents(
    session: Session, job_id: int, since: float | None = None, until: float | None = None
) -> list[Incident]:
    fault = func.coalesce(Incident.fault_at, Incident.created_at)
    stmt = select(Incident).where(Incident.job_id == job_id)
    if until is not None:
        stmt = stmt.where(fault <= until)
    if since is not None:
        stmt = stmt.where((Incident.resumed_at.is_(None)) | (Incident.resumed_at >= since))
    return list(session.scalars(stmt.order_by(fault)))


def next_fault(session: Session, inc: Incident) -> float | None:
    """The fault time of the job's next incident (by fault time, then id), or None: where
    this incident's recovery ends at the latest, as goodput orders incidents."""
    fault = func.coalesce(Incident.fault_at, Incident.created_at)
    mine = inc.fault_at if inc.fault_at is not None else inc.created_at
    return session.scalar(
        select(func.min(fault)).where(
            Incident.job_id == inc.job_id,
            (fault > mine) | ((fault == mine) & (Incident.id > inc.id)),
        )
    )


def redo_start(
    session: Session, job_id: int, since: float, until: float | None, ended_by: float | None
) -> float | None:
    """From when the steps that restarts starting between `since` and `until` (None: no
    end) can have discarded were run: the end of the last step before `since` whose
    number is below every step started in between (of the rows ended by `ended_by`), 0.0
    when there is none: from the job's first step. A step run before that one was
    discarded, if at all, by the restart that brought its number down, not by those.
    None: no step started in between."""
    stmt = select(func.min(Step.step)).where(
        Step.job_id == job_id, Step.end >= since, Step.start >= since
    )
    if until is not None:
        stmt = stmt.where(Step.start <= until)
    if ended_by is not None:
        stmt = stmt.where(Step.end <= ended_by)
    lowest = session.scalar(stmt)
    if lowest is None:
        return None
    below = session.scalar(
        select(func.max(Step.end)).where(
            Step.job_id == job_id, Step.end < since, Step.step < lowest
        )
    )
    return 0.0 if below is None else below


def placements(session: Session, job_id: int) -> list[Placement]:
    """Each rank's node and GPU (the GPU whose index is the rank's local rank)."""
    rows = session.execute(
        select(Rank.rank, Node.name, Rank.node_id, Rank.local_rank, Gpu.uuid)
        .join(Node, Node.id == Rank.node_id)
        .outerjoin(Gpu, and_(Gpu.node_id == Rank.node_id, Gpu.index == Rank.local_rank))
        .where(Rank.job_id == job_id)
        .order_by(Rank.rank)
    ).all()
    return [Placement(*r) for r in rows]


def _scored_start() -> Any:
    """A step's start as the straggler scores see it: when the rank reported its own
    compute time, `end - compute_s`, so `end - start` is the work without the wait in
    collectives (in synchronous training the wall-clock steps of all ranks are equal)."""
    return case((Step.compute_s.is_not(None), Step.end - Step.compute_s), else_=Step.start)


def _scored_row() -> tuple[Any, ...]:
    """(id, rank, step, start as scored, end, attempt, iteration) of a step row."""
    return (Step.id, Step.rank, Step.step, _scored_start(), Step.end, Step.attempt, Step.iteration)


def step_rows_after(
    session: Session, job_id: int, cursor: int, limit: int
) -> list[tuple[int, int, int, float, float, int, int]]:
    """(id, rank, step, start, end, attempt, iteration) of rows stored after the cursor."""
    return [
        tuple(r)
        for r in session.execute(
            select(*_scored_row())
            .where(Step.job_id == job_id, Step.id > cursor)
            .order_by(Step.id)
            .limit(limit)
        )
    ]


def recent_step_rows(
    session: Session, job_id: int, limit: int
) -> list[tuple[int, int, int, float, float, int, int]]:
    """The newest `limit` rows by end time, in storage order (a detector's first load)."""
    rows = session.execute(
        select(*_scored_row()).where(Step.job_id == job_id).order_by(Step.end.desc()).limit(limit)
    ).all()
    return sorted((tuple(r) for r in rows), key=lambda r: r[0])


def straggler_flags(
    session: Session, job: str | None = None, node_id: int | None = None
) -> dict[tuple[str, str, int | None], dict[str, Any]]:
    """The persisted flag state: the latest straggler event per (job, scope, rank) (rank
    None for a node flag), as {"flagged", "since", "node_id", "data"}."""
    stmt = select(Event).where(Event.kind == "straggler")
    if job is not None:
        stmt = stmt.where(Event.job == job)
    if node_id is not None:
        stmt = stmt.where(Event.node_id == node_id)
    out: dict[tuple[str, str, int | None], dict[str, Any]] = {}
    for e in session.scalars(stmt.order_by(Event.ts, Event.id)):
        data = e.data or {}
        scope = str(data.get("scope", "rank"))
        key = (e.job or "", scope if scope == "rank" else f"node:{e.node_id}", e.rank)
        out[key] = {
            "flagged": bool(data.get("flagged")),
            "since": e.ts if data.get("flagged") else None,
            "node_id": e.node_id,
            "gpu_uuid": e.gpu_uuid,
            "data": data,
        }
    return out


def active_jobs(session: Session, seen_after: float) -> list[Job]:
    return list(session.scalars(select(Job).where(Job.last_seen >= seen_after).order_by(Job.id)))


def node_by_name(session: Session, name: str) -> Node | None:
    return session.scalar(select(Node).where(Node.name == name))


def node_gpus(session: Session, node_id: int) -> list[tuple[str, int]]:
    rows = session.execute(
        select(Gpu.uuid, Gpu.index).where(Gpu.node_id == node_id).order_by(Gpu.index)
    )
    return [(uuid, index) for uuid, index in rows]


# --- an incident's recovery, from the job's steps ---------------------------------------


def _newer_generation(inc: Incident) -> Any:
    if inc.fault_attempt is None or inc.fault_iteration is None:
        return None
    return or_(
        Step.attempt > inc.fault_attempt,
        and_(Step.attempt == inc.fault_attempt, Step.iteration > inc.fault_iteration),
    )


def first_step_after(session: Session, inc: Incident) -> Any:
    """The first step of the job's recovery, or None: (step, start, end). It is a step of a
    later generation than the fault's (or one started after the restart ack) that started
    after the current action was taken (or after the fault, when none was): a step still
    in flight at the fault, or one of a restart that came before the action, is not the
    action's resumption."""
    if inc.fault_at is None:
        return None
    conds = []
    newer = _newer_generation(inc)
    if newer is not None:
        conds.append(newer)
    if inc.restarted_at is not None:
        conds.append(Step.start >= inc.restarted_at)
    if not conds:
        return None
    after = max(inc.fault_at, inc.acted_at or 0.0)
    return session.execute(
        select(Step.step, Step.start, Step.end)
        .where(Step.job_id == inc.job_id, Step.start >= after, or_(*conds))
        .order_by(Step.end)
        .limit(1)
    ).first()


def recovered_by_itself(session: Session, inc: Incident) -> Any:
    """The first step of a generation later than the fault's that started after the
    fault: the job restarted without trainguard (NVRx's Wrapper, its launcher), or None:
    (step, start, end)."""
    newer = _newer_generation(inc)
    if newer is None or inc.fault_at is None:
        return None
    return session.execute(
        select(Step.step, Step.start, Step.end)
        .where(
            Step.job_id == inc.job_id,
            Step.end >= inc.fault_at,  # implied by the start; bounds the (job_id, end) scan
            Step.start >= inc.fault_at,
            newer,
        )
        .order_by(Step.end)
        .limit(1)
    ).first()
