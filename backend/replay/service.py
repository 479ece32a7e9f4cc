"""A policy replay from start to report: export the period (reads only), refuse what
cannot be replayed (no evidence, a period past the configured limits), replay it under
the policy in force and under the candidate, compare (docs/replay.md)."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from trainguard.backend.engine.policy import Policy
from trainguard.backend.errors import DomainError
from trainguard.backend.replay import report, run, trace
from trainguard.backend.replay.trace import Trace, TraceError


class ReplayRefused(DomainError):
    """A replay that is not run (bad period, no evidence, bad trace): 422."""

    status_code = 422


class ReplayTooLarge(DomainError):
    """A period past the configured limits: 413, naming the limit."""

    status_code = 413


@dataclass(frozen=True)
class Limits:
    max_events: int
    max_incidents: int


def export(
    session: Session, since: float, until: float, job: str | None, redact: bool = False
) -> Trace:
    try:
        return trace.export(session, since, until, job, redact)
    except TraceError as exc:
        raise ReplayRefused(str(exc)) from None
    finally:
        session.rollback()  # a read: nothing of it is kept


def check(tr: Trace, limits: Limits) -> None:
    """Refuse an empty period and one too large for the limits."""
    n = tr.decided_events()
    if n == 0:
        what = f" of job {tr.job}" if tr.job else ""
        raise ReplayRefused(
            f"no evidence{what} was recorded between {_when(tr.since)} and {_when(tr.until)}: "
            "nothing to replay",
            code="no_evidence",
        )
    if n > limits.max_events:
        raise ReplayTooLarge(
            f"the period holds {n} events, more than the replay limit of {limits.max_events} "
            "(TRAINGUARD_REPLAY_MAX_EVENTS): replay a shorter period or one job",
            code="replay_limit",
        )
    incidents = len(tr["incident"])
    if incidents > limits.max_incidents:
        raise ReplayTooLarge(
            f"the period holds {incidents} incidents, more than the replay limit of "
            f"{limits.max_incidents} (TRAINGUARD_REPLAY_MAX_INCIDENTS): replay a shorter "
            "period or one job",
            code="replay_limit",
        )


def replay(
    tr: Trace,
    current: Policy,
    candidate: Policy | None,
    *,
    limits: Limits,
    fresh_within_s: float,
    sweep_s: float = 0.5,
    folder: Path | None = None,
) -> dict[str, Any]:
    """Both runs and the report; the scratch databases go with the temporary folder."""
    check(tr, limits)
    if folder is None:
        with tempfile.TemporaryDirectory(prefix="tg-replay-") as tmp:
            return replay(
                tr,
                current,
                candidate,
                limits=limits,
                fresh_within_s=fresh_within_s,
                sweep_s=sweep_s,
                folder=Path(tmp),
            )
    started = time.perf_counter()
    kw: dict[str, Any] = {"fresh_within_s": fresh_within_s, "sweep_s": sweep_s}
    cur = run.replay(tr, current, folder, name="current.db", **kw)
    cand = run.replay(tr, candidate, folder, name="candidate.db", **kw) if candidate else None
    out = report.compare(tr, cur, cand)
    out["policies"] = {
        "current": current.source,
        "candidate": candidate.source if candidate else None,
    }
    out["policy_changes"] = report.policy_changes(current, candidate) if candidate else []
    out["replay_s"] = round(time.perf_counter() - started, 3)
    return out


def replay_under(settings: Any, tr: Trace, candidate: Policy | None) -> dict[str, Any]:
    """`replay` with the server's settings: its policy in force, limits and cadence (the
    CLI and the route alike)."""
    return replay(
        tr,
        settings.policy,
        candidate,
        limits=Limits(settings.replay_max_events, settings.replay_max_incidents),
        fresh_within_s=settings.node_down_after_s,
        sweep_s=settings.engine_sweep_s,
    )


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
