"""Analytics reports: straggler flags and scores, goodput/badput, checkpoint advice."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainguard.backend.analytics import advice
from trainguard.backend.analytics import repository as repo
from trainguard.backend.analytics.goodput import Accounting, account, redone
from trainguard.backend.errors import DomainError, NotFound
from trainguard.backend.models import Event, Incident, Job

if TYPE_CHECKING:
    from trainguard.backend.analytics.monitor import AnalyticsMonitor
    from trainguard.backend.analytics.stragglers import StragglerConfig

WINDOWS: dict[str, float | None] = {"1h": 3600.0, "24h": 86400.0, "all": None}
FAULT_KINDS = ("xid", "gpu_lost", "rank_exit", "exception", "hang", "heartbeat_lost")
FAULT_MATCH_S = 30.0  # a fault event this close to an incident's fault_at names its node


def resolve_until(
    session: Session, job: Job, until: float | None, now: float, idle_after_s: float
) -> float:
    """`until` (default now), up to the job's end: a job that ended (finished, failed) at
    `ended_at`; a stopped job (stop_job: nothing restarts it) at the stop, or at its last
    step if its ranks trained on after it; a job silent for idle_after_s at its last
    completed step. Without this the time after the end would count as recovery (the
    stop's incident is never resumed) and goodput would fall for ever."""
    u = now if until is None else until
    if job.ended_at is not None:
        return min(u, job.ended_at)
    if job.state == "stopped":
        last = repo.last_activity(session, job.id)
        stop = job.state_since if job.state_since is not None else job.last_seen
        return min(u, max(stop, last if last is not None else stop))
    if now - job.last_seen > idle_after_s:
        last = repo.last_activity(session, job.id)
        u = min(u, last if last is not None else job.last_seen)
    return u


def waiting_since(session: Session, job: Job) -> float | None:
    """When a job that waits for capacity (state `waiting`) began to: when it was set
    waiting, or its last step if it trained on after that (its ranks may outlive the
    exclusion that left it no node). None for a job that does not wait. The time from
    there is `waiting`, not recovery: the job's open incident waits for a node, not for
    the job."""
    if job.state != "waiting":
        return None
    began = job.state_since if job.state_since is not None else job.last_seen
    last = repo.last_activity(session, job.id)
    return began if last is None else max(began, last)


def accounting(
    session: Session,
    job: Job,
    window: str,
    now: float,
    points: int,
    idle_after_s: float,
    until: float | None = None,
) -> Accounting:
    if window not in WINDOWS:
        raise DomainError(f"window must be one of {', '.join(WINDOWS)}")
    u = resolve_until(session, job, until, now, idle_after_s)
    first = repo.first_step_start(session, job.id)
    start = repo.job_start(session, job, first)
    span = WINDOWS[window]
    since = start if span is None else max(start, u - span)
    ckpt = repo.checkpoint_events(session, job.name, since, u)
    # (fault, resumed_at): account() ends the recovery where the resuming step starts.
    incidents = [
        (i.fault_at if i.fault_at is not None else i.created_at, i.resumed_at)
        for i in repo.incidents(session, job.id, since, u)
    ]
    return account(
        repo.cohort_steps(session, job.id, since, u),
        job_start=start,
        first_step_start=first,
        since=since,
        until=u,
        saves=repo.blocking_spans(ckpt, "save"),
        restores=repo.blocking_spans(ckpt, "restore"),
        incidents=incidents,
        waiting_since=waiting_since(session, job),
        worlds=repo.world_sizes(session, job.name, u),
        points=points,
    )


def goodput_report(
    session: Session,
    job: Job,
    window: str,
    points: int,
    idle_after_s: float,
    until: float | None = None,
) -> dict[str, Any]:
    acc = accounting(session, job, window, time.time(), points, idle_after_s, until)
    return {
        "job": job.name,
        "window": window,
        "since": acc.since,
        "until": acc.until,
        "elapsed_s": acc.elapsed_s,
        "productive_s": acc.productive_s,
        "goodput": acc.goodput,
        "badput": acc.badput,
        "ideal_step_s": acc.ideal_step_s,
        "productive_steps": acc.productive_steps,
        "wasted_steps": acc.wasted_steps,
        "series": acc.series,
    }


def lost_steps(session: Session, inc: Incident) -> int | None:
    """An incident's lost steps. Until the job has a step of a generation after the
    fault's (no restart yet): the estimate stored when it opened (fault step - the last
    checkpoint's). From then on: the steps its recovery redid, by the definition goodput's
    wasted steps use (`goodput.redone`): the executions discarded by the rollbacks that
    started at or after its fault, before the job's next incident's fault and, once it
    resumed, by `resumed_at`. Each rollback belongs to one incident at most, so the
    incidents' lost steps add up to the job's wasted steps (less those of a restart no
    incident covers)."""
    if repo.recovered_by_itself(session, inc) is None:  # (None too without a fault time)
        return inc.lost_steps
    assert inc.fault_at is not None
    since, resumed = inc.fault_at, inc.resumed_at
    nxt = repo.next_fault(session, inc)
    until = min((t for t in (resumed, nxt) if t is not None), default=None)
    # The restart's first step ended by `resumed_at` (on every rank when the last node's
    # ack set it; on one at least, enough to find it, when the sweep did), and what it
    # discarded ended before it started: no row that ended later is read.
    ended_by = resumed if until is not None and until == resumed else None
    begin = repo.redo_start(session, inc.job_id, since, until, ended_by)
    if begin is None:
        return 0
    steps = repo.cohort_steps(session, inc.job_id, begin, until, ended_by)

    def mine(start: float) -> bool:
        return (
            since <= start
            and (resumed is None or start <= resumed)
            and (nxt is None or start < nxt)
        )

    return sum(1 for f in redone(steps).values() if mine(steps[f].start))


# --- stragglers ------------------------------------------------------------------------------


def straggler_report(
    session: Session, job: Job, cfg: StragglerConfig, monitor: AnalyticsMonitor | None
) -> dict[str, Any]:
    """Flags from the persisted events (the same on every replica), scores from this
    process's detector (None until it has scored a window)."""
    flags = repo.straggler_flags(session, job.name)
    scores, reference, evaluated_at = monitor.scores(job.id) if monitor else ({}, None, None)
    placements = repo.placements(session, job.id)
    ranks = []
    for p in placements:
        f = flags.get((job.name, "rank", p.rank), {})
        s = scores.get(p.rank)
        ranks.append(
            {
                "rank": p.rank,
                "node": p.node,
                "local_rank": p.local_rank,
                "gpu_uuid": p.gpu_uuid,
                "relative_score": s.relative_score if s else None,
                "individual_score": s.individual_score if s else None,
                "median_step_s": s.median_step_s if s else None,
                "flagged": bool(f.get("flagged")),
                "flagged_since": f.get("since"),
            }
        )
    nodes: dict[str, dict[str, Any]] = {}
    for p, r in zip(placements, ranks, strict=True):
        n = nodes.setdefault(
            p.node,
            {"node": p.node, "flagged": False, "ranks": 0, "flagged_ranks": 0, "gpus": []},
        )
        n["ranks"] += 1
        if r["flagged"]:
            n["flagged_ranks"] += 1
            if p.gpu_uuid:
                n["gpus"].append(p.gpu_uuid)
        node_flag = flags.get((job.name, f"node:{p.node_id}", None), {})
        n["flagged"] = bool(node_flag.get("flagged"))
    return {
        "job": job.name,
        "threshold": cfg.threshold,
        "unflag_threshold": cfg.unflag_threshold,
        "window_steps": cfg.window_steps,
        "flag_windows": cfg.flag_windows,
        "unflag_windows": cfg.unflag_windows,
        "reference_step_s": reference,
        "evaluated_at": evaluated_at,
        "ranks": ranks,
        "nodes": list(nodes.values()),
    }


def node_straggler_report(session: Session, node: str) -> dict[str, Any]:
    """A node's straggler flags in every job: whole-node flags, flagged ranks, their GPUs."""
    n = repo.node_by_name(session, node)
    if n is None:
        raise NotFound(f"no node named {node!r}")
    gpus: dict[str, dict[str, Any]] = {
        uuid: {"uuid": uuid, "index": idx, "flagged": False, "jobs": []}
        for uuid, idx in repo.node_gpus(session, n.id)
    }
    jobs: dict[str, dict[str, Any]] = {}
    for (job, scope, rank), f in repo.straggler_flags(session, node_id=n.id).items():
        j = jobs.setdefault(job, {"job": job, "node_flagged": False, "ranks": []})
        if scope != "rank":
            j["node_flagged"] = f["flagged"]
        elif f["flagged"]:
            j["ranks"].append(
                {"rank": rank, "gpu_uuid": f["gpu_uuid"], "flagged_since": f["since"]}
            )
            g = gpus.get(f["gpu_uuid"] or "")
            if g is not None:
                g["flagged"] = True
                g["jobs"].append(job)
    for j in jobs.values():
        j["ranks"].sort(key=lambda r: r["rank"])
    return {
        "node": node,
        "flagged": any(j["node_flagged"] for j in jobs.values()),
        "jobs": sorted(
            (j for j in jobs.values() if j["node_flagged"] or j["ranks"]), key=lambda j: j["job"]
        ),
        "gpus": list(gpus.values()),
    }


# --- advice ----------------------------------------------------------------------------------


def advice_report(
    session: Session, job: Job, idle_after_s: float, assumed_mtbf_per_gpu_s: float
) -> dict[str, Any]:
    """Measured MTBF (job and nodes), checkpoint cost and interval, restart time, and the
    recommended checkpoint interval with the expected efficiency at both intervals."""
    acc = accounting(session, job, "all", time.time(), 1, idle_after_s)
    observed = acc.elapsed_s
    incidents = repo.incidents(session, job.id)
    # Operator restarts are planned; restarts no incident explains count as failures.
    failures = [i for i in incidents if i.trigger != "manual"]
    unexplained = [d for d in acc.disruptions if not d.covered_by_incident]
    n_failures = len(failures) + len(unexplained)
    mtbf = observed / n_failures if n_failures else None

    placements = repo.placements(session, job.id)
    names = {p.node_id: p.node for p in placements}
    per_node: dict[str, int] = dict.fromkeys(sorted(set(names.values())), 0)
    for inc in failures:
        node = _incident_node(session, job, inc, names)
        if node is not None:
            per_node[node] = per_node.get(node, 0) + 1

    ckpt = repo.checkpoint_events(session, job.name)
    saves = _cohort_checkpoints(ckpt, "save")
    restores = _cohort_checkpoints(ckpt, "restore")
    cost = _median([b for _, b in saves])
    ends = sorted(t for t, _ in saves)
    interval = _median([b - a for a, b in itertools.pairwise(ends) if b > a])

    recoveries = [
        (i.level, i.resumed_at - i.fault_at)
        for i in incidents
        if i.fault_at is not None and i.resumed_at is not None and i.resumed_at >= i.fault_at
    ]
    by_level: dict[str, list[float]] = {}
    for level, r in recoveries:
        by_level.setdefault(level, []).append(r)
    restart_s = _median([r for _, r in recoveries]) or _median(
        [d.first_start - d.last_end for d in unexplained]
    )

    gpus = max(job.world_size, len(placements), 1)
    assumed = assumed_mtbf_per_gpu_s / gpus
    return {
        "job": job.name,
        "observed_s": observed,
        "failures": n_failures,
        "failures_without_incident": len(unexplained),
        "mtbf_s": mtbf,
        "mtbf_lower_bound_s": observed if mtbf is None else None,
        "mtbf_source": "measured" if mtbf is not None else "assumed",
        "assumed_mtbf_s": assumed,
        "gpus": gpus,
        "nodes": [
            {"node": node, "failures": n, "mtbf_s": observed / n if n else None}
            for node, n in per_node.items()
        ],
        "checkpoint": {
            "saves": len(saves),
            "cost_s": cost,
            "interval_s": interval,
            "restores": len(restores),
            "restore_s": _median([b for _, b in restores]),
        },
        "restart": {
            "samples": len(recoveries) or len(unexplained),
            "median_s": restart_s,
            "by_level": {
                level: {"count": len(v), "median_s": statistics.median(v)}
                for level, v in sorted(by_level.items())
            },
        },
        "recommendation": advice.recommend(cost, mtbf or assumed, restart_s, interval),
    }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _cohort_checkpoints(
    events: Sequence[tuple[float, Mapping[str, Any], int | None]], phase: str
) -> list[tuple[float, float]]:
    """One (end ts, blocking s) per checkpoint: the slowest rank's, grouped by step (or,
    without a step, by the minute)."""
    groups: dict[Any, tuple[float, float]] = {}
    for ts, data, _ in events:
        b = data.get("blocking_s")
        if data.get("phase") != f"{phase}_end" or not isinstance(b, int | float):
            continue
        step = data.get("step")
        key = ("step", step) if isinstance(step, int) else ("ts", int(ts // 60))
        end, blocking = groups.get(key, (ts, 0.0))
        groups[key] = (max(end, ts), max(blocking, float(b)))
    return sorted(groups.values())


def _incident_node(
    session: Session, job: Job, inc: Incident, names: Mapping[int, str]
) -> str | None:
    """The node an incident happened on: its own node when the engine recorded one, else
    the node of the first fault event of the job (or an XID on one of its nodes) near the
    fault time."""
    node_id = getattr(inc, "node_id", None)  # the engine adds Incident.node_id
    if node_id is not None:
        return names.get(node_id)
    fault = inc.fault_at if inc.fault_at is not None else inc.created_at
    row = session.execute(
        select(Event.node_id)
        .where(
            Event.kind.in_(FAULT_KINDS),
            Event.ts >= fault - FAULT_MATCH_S,
            Event.ts <= fault + FAULT_MATCH_S,
            (Event.job == job.name) | (Event.node_id.in_(list(names))),
        )
        .order_by(Event.ts)
        .limit(1)
    ).first()
    return names.get(row[0]) if row and row[0] is not None else None
