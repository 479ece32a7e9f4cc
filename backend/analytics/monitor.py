"""The periodic analytics pass: feeds new step rows to each active job's straggler detector,
stores flag changes as `straggler` events (and publishes them on the live bus), and keeps
the goodput and straggler gauges for /metrics fresh.

One detector per job lives in this process. Flags are persisted as events, so readers on any
replica (and this one after a restart) see the same flags; scores live in memory only.
Scoring and flag events run only where `is_leader()` says so (the decision engine's
leader: one writer per database); every replica keeps the goodput gauges.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from trainguard.backend.analytics import repository as repo
from trainguard.backend.analytics import service
from trainguard.backend.analytics.stragglers import (
    RankState,
    StragglerConfig,
    StragglerDetector,
    Transition,
    node_flags,
)
from trainguard.backend.cluster.service import event_dict
from trainguard.backend.jobs import timeouts
from trainguard.backend.models import Event, Job

log = logging.getLogger(__name__)

ACTIVE_WITHIN_S = 600.0  # a job is scored while it reported within this window
GAUGES_WITHIN_S = 86400.0  # goodput gauges for jobs seen within a day
MAX_ROWS_PER_TICK = 2_000_000


@dataclass
class _JobState:
    job_id: int
    name: str
    detector: StragglerDetector
    cursor: int = 0
    node_flags: dict[str, bool] = field(default_factory=dict)
    evaluated_at: float | None = None


class AnalyticsMonitor:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        cfg: StragglerConfig,
        publish: Callable[[dict[str, Any]], None] | None = None,
        goodput_refresh_s: float = 60.0,
        idle_after_s: float = 300.0,
        is_leader: Callable[[], bool] | None = None,
        timeouts_fresh_s: float = ACTIVE_WITHIN_S,
    ) -> None:
        self.sessions = sessions
        self.is_leader = is_leader
        self.cfg = cfg
        self.publish = publish
        self.goodput_refresh_s = goodput_refresh_s
        self.idle_after_s = idle_after_s
        # Ranks heard within it are live for the timeout check (GET /jobs/{job}'s window).
        self.timeouts_fresh_s = timeouts_fresh_s
        self.gauges: dict[str, dict[str, Any]] = {}  # job -> whole-run goodput, badput
        self.stragglers: dict[str, int] = {}  # job -> flagged ranks, every tick
        self.stats = {"ticks": 0, "rows": 0, "events": 0, "tick_s": 0.0}
        self._jobs: dict[int, _JobState] = {}
        self._lock = threading.Lock()
        self._gauges_at = 0.0

    # --- reads for the API ---------------------------------------------------------------

    def scores(self, job_id: int) -> tuple[dict[int, RankState], float | None, float | None]:
        """A copy of the job's rank scores, the reference step time and the evaluation time."""
        with self._lock:
            st = self._jobs.get(job_id)
            if st is None:
                return {}, None, None
            ranks = {r: RankState(**_fields(s)) for r, s in st.detector.ranks.items()}
            return ranks, st.detector.reference_step_s, st.evaluated_at

    # --- the periodic pass -----------------------------------------------------------------

    def tick(self, now: float | None = None) -> list[dict[str, Any]]:
        """Evaluate every active job; returns the events stored (already published)."""
        t0 = time.perf_counter()
        now = time.time() if now is None else now
        events: list[dict[str, Any]] = []
        leads = self.is_leader is None or self.is_leader()
        with self._lock, self.sessions() as session:
            if not leads:
                self._jobs.clear()  # a new leadership starts from the persisted flags
            for job in repo.active_jobs(session, now - ACTIVE_WITHIN_S) if leads else ():
                try:
                    stored = self._evaluate(session, job, now)
                    session.commit()
                    events += stored
                except Exception:
                    session.rollback()
                    # Rebuilt from the persisted flags next time, so memory and events agree.
                    self._jobs.pop(job.id, None)
                    log.exception("straggler evaluation of job %s failed", job.name)
                events += self._timeouts(session, job, now)
        if now - self._gauges_at >= self.goodput_refresh_s:
            self._gauges_at = now
            self.refresh_gauges(now, live_counts=leads)
        for ev in events:
            if self.publish:
                self.publish(ev)
        self.stats["ticks"] += 1
        self.stats["events"] += len(events)
        self.stats["tick_s"] = time.perf_counter() - t0
        return events

    def _timeouts(self, session: Session, job: Job, now: float) -> list[dict[str, Any]]:
        """The job's timeout hierarchy (jobs.timeouts): an event for each new violation."""
        try:
            stored = timeouts.refresh(session, job, now - self.timeouts_fresh_s, now)
            session.commit()
        except Exception:
            session.rollback()
            log.exception("timeout check of job %s failed", job.name)
            return []
        return [event_dict(e, None) for e in stored]

    def _evaluate(self, session: Session, job: Job, now: float) -> list[dict[str, Any]]:
        st = self._jobs.get(job.id)
        if st is None:
            st = self._jobs[job.id] = self._bootstrap(session, job)
        else:
            rows = repo.step_rows_after(session, job.id, st.cursor, MAX_ROWS_PER_TICK)
            self._feed(st, rows)
        st.detector.world_size = job.world_size
        transitions = st.detector.evaluate()
        st.evaluated_at = now
        self.stragglers[job.name] = len(st.detector.flagged())
        if not transitions:
            return []
        placements = {p.rank: p for p in repo.placements(session, job.id)}
        stored: list[tuple[Event, str | None]] = []
        for t in transitions:
            p = placements.get(t.rank)
            stored.append((self._rank_event(job.name, t, p, now), p.node if p else None))
        flags = node_flags(st.detector.flagged(), {r: p.node for r, p in placements.items()})
        node_ids = {p.node: p.node_id for p in placements.values()}
        ts = transitions[-1].ts
        for node, flagged in sorted(flags.items()):
            if st.node_flags.get(node, False) != flagged:
                n = sum(1 for p in placements.values() if p.node == node)
                stored.append(
                    (self._node_event(job.name, node, node_ids[node], flagged, n, ts, now), node)
                )
        st.node_flags = flags
        session.add_all(e for e, _ in stored)
        session.flush()
        return [event_dict(e, node) for e, node in stored]

    def _bootstrap(self, session: Session, job: Job) -> _JobState:
        st = _JobState(job.id, job.name, StragglerDetector(self.cfg))
        for (_, scope, rank), flag in repo.straggler_flags(session, job.name).items():
            data = flag["data"]
            gen = None
            if isinstance(data.get("attempt"), int) and isinstance(data.get("iteration"), int):
                gen = (data["attempt"], data["iteration"])
            if scope == "rank" and rank is not None and flag["flagged"]:
                st.detector.restore(rank, flag["since"], gen)
        placements = repo.placements(session, job.id)
        st.node_flags = node_flags(st.detector.flagged(), {p.rank: p.node for p in placements})
        # Warm up on about K windows of the newest rows: less than K complete windows, so a
        # replay of windows a previous process already scored cannot flag on its own, and
        # flags it has persisted are not re-announced.
        world = max(job.world_size, len(placements), 1)
        limit = min(MAX_ROWS_PER_TICK, self.cfg.flag_windows * self.cfg.window_steps * world)
        self._feed(st, repo.recent_step_rows(session, job.id, limit))
        return st

    def _feed(
        self, st: _JobState, rows: list[tuple[int, int, int, float, float, int, int]]
    ) -> None:
        add = st.detector.add
        for _id, rank, step, start, end, attempt, iteration in rows:
            add(rank, step, start, end, attempt, iteration)
        if rows:
            st.cursor = max(st.cursor, rows[-1][0])
            self.stats["rows"] += len(rows)

    def _rank_event(self, job: str, t: Transition, p: repo.Placement | None, now: float) -> Event:
        verb = "flagged slow" if t.flagged else "no longer slow"
        score = "" if t.relative_score is None else f": relative score {t.relative_score:.2f}"
        return Event(
            node_id=p.node_id if p else None,
            ts=t.ts,
            received_at=now,
            kind="straggler",
            gpu_uuid=p.gpu_uuid if p else None,
            job=job,
            rank=t.rank,
            message=f"rank {t.rank} {verb}{score} ({t.reason})",
            data={
                "scope": "rank",
                "flagged": t.flagged,
                "score": t.relative_score,
                "relative_score": t.relative_score,
                "individual_score": t.individual_score,
                "median_step_s": t.median_step_s,
                "reference_step_s": t.reference_step_s,
                "threshold": self.cfg.threshold if t.flagged else self.cfg.unflag_threshold,
                "windows": self.cfg.flag_windows if t.flagged else self.cfg.unflag_windows,
                "attempt": t.gen[0],
                "iteration": t.gen[1],
                "reason": t.reason,
            },
        )

    @staticmethod
    def _node_event(
        job: str, node: str, node_id: int, flagged: bool, ranks: int, ts: float, now: float
    ) -> Event:
        verb = "all ranks slow" if flagged else "no longer all slow"
        return Event(
            node_id=node_id,
            ts=ts,
            received_at=now,
            kind="straggler",
            job=job,
            message=f"node {node}: {verb} in job {job}",
            data={"scope": "node", "flagged": flagged, "ranks": ranks},
        )

    # --- gauges ----------------------------------------------------------------------------

    def refresh_gauges(self, now: float | None = None, live_counts: bool = False) -> None:
        """Whole-run goodput of every job seen within a day; the flagged-rank counts from
        the persisted flags unless this process scores them live."""
        now = time.time() if now is None else now
        gauges: dict[str, dict[str, Any]] = {}
        counts: dict[str, int] = {}
        with self.sessions() as session:
            if not live_counts:
                for (name, scope, _), f in repo.straggler_flags(session).items():
                    if scope == "rank":
                        counts[name] = counts.get(name, 0) + int(f["flagged"])
            for job in repo.active_jobs(session, now - GAUGES_WITHIN_S):
                try:
                    acc = service.accounting(session, job, "all", now, 1, self.idle_after_s)
                except Exception:
                    log.exception("goodput of job %s failed", job.name)
                    continue
                gauges[job.name] = {
                    "goodput": acc.goodput,
                    "productive_s": acc.productive_s,
                    "elapsed_s": acc.elapsed_s,
                    "badput": acc.badput,
                }
        self.gauges = gauges
        if not live_counts:
            self.stragglers = counts


def _fields(s: RankState) -> dict[str, Any]:
    return {k: getattr(s, k) for k in RankState.__slots__}


def from_settings(
    settings: Any,
    sessions: sessionmaker[Session],
    publish: Callable[[dict[str, Any]], None] | None = None,
    is_leader: Callable[[], bool] | None = None,
    overrides: dict[str, Any] | None = None,
) -> AnalyticsMonitor:
    """The monitor configured by Settings, with the policy file's [stragglers] keys
    (`overrides`) on top; a bad combination fails here, at startup."""
    values = {
        "threshold": settings.straggler_threshold,
        "unflag_threshold": settings.straggler_unflag_threshold,
        "window_steps": settings.straggler_window_steps,
        "flag_windows": settings.straggler_flag_windows,
        "unflag_windows": settings.straggler_unflag_windows,
        "reference_quantile": settings.straggler_reference_quantile,
    }
    values.update(overrides or {})
    cfg = StragglerConfig(**values)
    return AnalyticsMonitor(
        sessions,
        cfg,
        publish=publish,
        goodput_refresh_s=settings.goodput_refresh_s,
        idle_after_s=settings.goodput_idle_after_s,
        is_leader=is_leader,
        timeouts_fresh_s=settings.node_down_after_s,
    )


async def run_periodically(monitor: AnalyticsMonitor, interval_s: float) -> None:
    """The lifespan task: one tick every interval (in a worker thread), on a drift-free
    monotonic schedule; a failed tick is logged and the next one tries again."""
    if interval_s <= 0:
        return
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while True:
        next_at += interval_s
        await asyncio.sleep(max(0.0, next_at - loop.time()))
        try:
            await asyncio.to_thread(monitor.tick)
        except Exception as exc:  # the database may be down: try next tick
            log.warning("analytics tick failed: %s", exc)
        next_at = max(next_at, loop.time())
