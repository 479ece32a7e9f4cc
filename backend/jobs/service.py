"""Reads of training jobs: jobs, their ranks, step timings."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from trainguard.backend.errors import NotFound
from trainguard.backend.models import JOB_ENDED, Incident, Job, Node, Rank, Step

# A rank its node's agent has not listed for this long is gone (the ingest's
# _unlisted_ranks; the replay ends such ranks the same way).
UNLISTED_S = 30.0


def set_job_state(
    job: Job, state: str, now: float, reason: str = "", ended: float | None = None
) -> None:
    """The job's state (JOB_STATES) with its reason; an ended state ends the job's
    accounting (`ended_at`), any other but `stopped` reopens it. `ended`: when the job
    ended, where its ranks say (a `stopped` job ends only so: given up on, its ranks may
    still be training); it replaces the end only of a job that changes state or had none.
    The one place a job's state is written."""
    new_state = job.state != state
    if not new_state and job.state_reason == reason[:2000] and (ended is None or job.ended_at):
        return  # nothing changes (the sweep sets every job's state on every pass)
    if new_state:
        job.state_since = now
    job.state = state
    job.state_reason = reason[:2000]
    if state in JOB_ENDED:
        job.ended_at = job.ended_at or now
    elif state != "stopped":
        job.ended_at = None
    if ended is not None and (new_state or job.ended_at is None):
        job.ended_at = ended


def get_or_create_job(session: Session, name: str, now: float) -> Job:
    """The job of that name; a new one, seen now, when no rank of it ever reported."""
    job = session.scalar(select(Job).where(Job.name == name))
    if job is None:
        job = Job(name=name, first_seen=now, last_seen=now, world_size=1, attempt=0, iteration=0)
        session.add(job)
        session.flush()
    return job


def get_job(session: Session, name: str) -> Job:
    job = session.scalar(select(Job).where(Job.name == name))
    if job is None:
        raise NotFound(f"no job named {name!r}")
    return job


def job_dict(job: Job, open_incidents: int = 0, spare_capacity: int = 0) -> dict[str, Any]:
    return {
        "name": job.name,
        "first_seen": job.first_seen,
        "last_seen": job.last_seen,
        "world_size": job.world_size,
        "attempt": job.attempt,
        "iteration": job.iteration,
        "last_step": job.last_step,
        "open_incidents": open_incidents,
        "display_name": job.display_name or job.name,
        "state": job.state,
        "state_since": job.state_since,
        "state_reason": job.state_reason,
        "ended_at": job.ended_at,
        "spare_capacity": spare_capacity,
    }


def list_jobs(session: Session, spares: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """Every job, most recently active first; `spares`: spare capacity by job id."""
    open_counts = dict(
        session.execute(
            select(Incident.job_id, func.count())
            .where(Incident.status == "open")
            .group_by(Incident.job_id)
        ).all()
    )
    jobs = session.scalars(select(Job).order_by(Job.last_seen.desc())).all()
    spares = spares or {}
    return [job_dict(j, open_counts.get(j.id, 0), spares.get(j.id, 0)) for j in jobs]


def live_ranks(session: Session, job: Job, fresh_within_s: float) -> list[tuple[Rank, str]]:
    """Ranks reported alive by their agent within the window, with their node's name."""
    cutoff = time.time() - fresh_within_s
    return [
        (r, name)
        for r, name in session.execute(
            select(Rank, Node.name)
            .join(Node, Node.id == Rank.node_id)
            .where(Rank.job_id == job.id, Rank.alive.is_(True), Rank.updated_at >= cutoff)
            .order_by(Rank.rank)
        ).all()
    ]


def ranks(session: Session, job: Job) -> list[dict[str, Any]]:
    rows = session.execute(
        select(Rank, Node.name)
        .join(Node, Node.id == Rank.node_id)
        .where(Rank.job_id == job.id)
        .order_by(Rank.rank)
    ).all()
    return [
        {
            "rank": r.rank,
            "node": name,
            "local_rank": r.local_rank,
            "pid": r.pid,
            "attempt": r.attempt,
            "iteration": r.iteration,
            "last_heartbeat": r.last_heartbeat,
            "last_step": r.last_step,
            "alive": r.alive,
            "updated_at": r.updated_at,
            "in_process": r.in_process,
            "launcher": r.launcher,
            "max_restarts": r.max_restarts,
            "restart_count": r.restart_count,
            "timeouts": r.timeouts,
        }
        for r, name in rows
    ]


def steps(
    session: Session, job: Job, since: float | None, rank: int | None, limit: int
) -> dict[str, Any]:
    # Plain columns, not ORM objects: a 1,024-rank job's window is ~100k rows, and
    # building an object per row dominated this read.
    cols = (Step.rank, Step.step, Step.start, Step.end, Step.attempt, Step.iteration)
    stmt = select(*cols).where(Step.job_id == job.id)
    if since is not None:
        stmt = stmt.where(Step.end >= since)
    if rank is not None:
        stmt = stmt.where(Step.rank == rank)
    rows = session.execute(stmt.order_by(Step.end.desc()).limit(limit)).all()
    names = ("rank", "step", "start", "end", "attempt", "iteration")
    columns: dict[str, list[Any]] = {n: [] for n in names}
    lists = [columns[n] for n in names]
    for row in reversed(rows):  # oldest first
        for out, v in zip(lists, row, strict=True):
            out.append(v)
    return {"job": job.name, "columns": columns}


def capabilities(session: Session, job_id: int, since: float) -> dict[str, Any]:
    """What the job's live ranks declared: in_process only when every one of them runs
    under NVRx's Wrapper (a rank that declared nothing, an older SDK, is not counted
    against it); the launchers they run under."""
    rows = session.execute(
        select(Rank.in_process, Rank.launcher).where(
            Rank.job_id == job_id, Rank.alive.is_(True), Rank.updated_at >= since
        )
    ).all()
    declared = [p for p, _ in rows if p is not None]
    launchers = sorted({lch for _, lch in rows if lch})
    in_process = all(declared) if declared else None
    levels = ["in_process", "launcher"] if in_process is not False else ["launcher"]
    if launchers == ["none"]:
        levels = [lv for lv in levels if lv != "launcher"]
    return {"in_process": in_process, "launchers": launchers, "levels": levels}


def launcher_budget(session: Session, job_id: int, since: float) -> dict[str, int | None]:
    """The launcher's restart budget as the job's live ranks declared it: `max_restarts`
    (its --max-restarts), `restart_count` (the restarts used) and `restarts_left` (None:
    no live rank declared both). Each launcher counts its own (several torchruns), so the
    job has what its tightest launcher has left: the rank with the fewest restarts left."""
    rows = session.execute(
        select(Rank.max_restarts, Rank.restart_count).where(
            Rank.job_id == job_id,
            Rank.alive.is_(True),
            Rank.updated_at >= since,
            Rank.max_restarts.is_not(None),
            Rank.restart_count.is_not(None),
        )
    ).all()
    tightest: tuple[int, int] | None = None
    for most, used in rows:
        if most is None or used is None:
            continue  # (filtered out by the query; narrows the types)
        if tightest is None or most - used < tightest[0] - tightest[1]:
            tightest = (most, used)
    if tightest is None:
        return {"max_restarts": None, "restart_count": None, "restarts_left": None}
    most, used = tightest
    return {"max_restarts": most, "restart_count": used, "restarts_left": max(0, most - used)}
