"""The decision engine: a background thread of the backend that turns evidence into
incidents and actions, on the one replica that holds the leadership.

Evidence is read from the `events` table by a cursor (the highest event id read, kept in
`engine_state` so a new leader continues where the last one stopped). The ingest
writer's `on_stored` hook only wakes the thread (a set() on an Event: ingest never
waits for the engine), so evidence is decided on within milliseconds of its commit; a
periodic sweep (`sweep_s`, at most 1 s) covers what no event announces and finds
evidence another replica stored. On PostgreSQL, ids committed out of order by two
replicas leave temporary holes in the id sequence: the ids of a hole are read again for
`GAP_TTL_S` seconds.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from trainguard.backend.engine import lifecycle, silence, sweep
from trainguard.backend.engine.actions import HookJob
from trainguard.backend.engine.decide import Decider
from trainguard.backend.engine.evidence import EVIDENCE_KINDS, Evidence
from trainguard.backend.engine.leader import AdvisoryLockLeadership, Leadership, leadership_for
from trainguard.backend.engine.policy import Policy
from trainguard.backend.hooks import HookResult, run_hook
from trainguard.backend.incidents import acks, publish
from trainguard.backend.models import Event, Node
from trainguard.backend.models.control import EngineState

log = logging.getLogger(__name__)

T = TypeVar("T")
CURSOR = "events_cursor"
GAP_TTL_S = 10.0
MAX_GAP = 10_000


class DecisionEngine:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        policy: Policy,
        leadership: Leadership,
        *,
        fresh_within_s: float,
        sweep_s: float = 0.5,
        notifier: Any = None,
        bus: Any = None,
        clock: Callable[[], float] = time.time,
        batch: int = 2000,
        hook_workers: int = 4,
    ) -> None:
        self.sessions = sessions
        self.policy = policy
        self.leadership = leadership
        self.fresh_within_s = fresh_within_s
        self.sweep_s = sweep_s
        self.notifier = notifier
        self.bus = bus
        # Alert webhooks (backend/alerts), set by the app; per incident the last status
        # and escalation count alerted, so each change is announced once.
        self.alerts: Any = None
        self._alerted: dict[int, tuple[str, int, bool]] = {}
        self.started_at = time.time()
        self.clock = clock
        self.batch = batch
        self.decider = Decider(policy, fresh_within_s, clock)
        self.hi: int | None = None  # the cursor: highest event id read
        self.last_sweep_at: float | None = None
        self.cycles = 0
        self.errors = 0
        self.last_error = ""
        self._gaps: dict[int, float] = {}
        self._down_seen: set[tuple[int, float, str]] = set()
        self._leading_since = clock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._cycle = threading.Lock()
        self._stats_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._hooks = ThreadPoolExecutor(hook_workers, thread_name_prefix="tg-hook")
        self._hook_results: queue.SimpleQueue[tuple[HookJob, HookResult]] = queue.SimpleQueue()
        self._running_hooks: set[tuple[int, float]] = set()

    @classmethod
    def from_settings(
        cls, settings: Any, sessions: sessionmaker[Session], notifier: Any, bus: Any
    ) -> DecisionEngine:
        return cls(
            sessions,
            settings.policy,
            leadership_for(settings.url),
            fresh_within_s=settings.node_down_after_s,
            sweep_s=settings.engine_sweep_s,
            notifier=notifier,
            bus=bus,
        )

    # --- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="tg-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._hooks.shutdown(wait=False, cancel_futures=True)
        self.leadership.release()

    def wake(self) -> None:
        """Thread-safe and cheap: the next cycle starts now."""
        self._wake.set()

    def on_stored(self, stored: Any) -> None:
        """The ingest writer's hook, after each commit: wake on evidence, nothing more."""
        if any(e["kind"] in EVIDENCE_KINDS for e in stored.events):
            self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except OperationalError as exc:
                self._error(f"database unavailable: {str(exc.orig).strip()[:200]}")
            except Exception as exc:
                log.exception("engine cycle failed")
                self._error(f"{type(exc).__name__}: {exc}"[:300])
            self._wake.wait(self.sweep_s)
            self._wake.clear()

    def _error(self, msg: str) -> None:
        self.errors += 1
        self.last_error = msg
        log.warning("engine: %s", msg)

    # --- one cycle --------------------------------------------------------------------

    def run_once(self) -> bool:
        """Read new evidence, sweep, start due hooks; False when not the leader."""
        with self._cycle:
            if not self.leadership.ensure():
                if self.hi is not None:
                    log.warning("engine: not the leader any more; standing by")
                self.hi = None
                self._gaps.clear()
                return False
            if self.hi is None:
                self._load_cursor()
            self._hook_continuations()
            while self._read_events() >= self.batch:
                pass
            self._tx(self._sweep)
            self.last_sweep_at = self.clock()
            self.cycles += 1
            return True

    def _tx(self, fn: Callable[[Session], T]) -> T:
        """One transaction of decisions; after its commit: wake agents' long-polls, run
        the hooks it made due, publish the incidents it changed."""
        d = self.decider
        d.begin()
        try:
            with self.sessions() as s:
                with s.begin():
                    out = fn(s)
                changed = publish.take(s)
        except Exception:
            d.begin()
            raise
        with self._stats_lock:
            d.committed()
        hooks, commands = d.hooks_due, d.commands
        d.begin()
        if commands and self.notifier is not None:
            self.notifier.notify()
        for job in hooks:
            self._submit_hook(job)
        if changed:
            publish.publish(
                self.sessions, self.bus, changed, self._alert if self.alerts is not None else None
            )
        return out

    def _sweep(self, s: Session) -> None:
        now = self.clock()
        silence.silent_nodes(
            self.decider, s, now, self.fresh_within_s, self._down_seen, self._leading_since
        )
        sweep.self_recovered(self.decider, s, now)
        sweep.due_incidents(self.decider, s, now)
        sweep.failed_incidents(self.decider, s, now)
        sweep.resumed_from_steps(self.decider, s, now)
        sweep.relaunch_waits(self.decider, s, now)
        sweep.unfinished_actions(self.decider, s, now)
        acks.name_replacements(s, now)
        sweep.orphaned_hooks(self.decider, s, now, self._running_hooks)
        lifecycle.agents_back(self.decider, s, now)
        lifecycle.waiting_jobs(self.decider, s, now)
        lifecycle.job_states(self.decider, s, now)
        lifecycle.readmissions(self.decider, s, now, self._running_hooks)

    # --- the cursor over events -----------------------------------------------------------

    def _load_cursor(self) -> None:
        """Continue from the stored cursor, but never further back than the oldest
        evidence still young enough to act on."""
        max_age = self.policy.model.incidents.max_evidence_age_s
        with self.sessions() as s:
            state = s.get(EngineState, CURSOR)
            stored = int(state.value.get("hi", 0)) if state is not None else 0
            floor = s.scalar(select(func.min(Event.id)).where(Event.ts >= self.clock() - max_age))
            top = s.scalar(select(func.max(Event.id))) or 0
        self.hi = max(stored, top if floor is None else floor - 1)
        self._leading_since = self.clock()
        log.info("engine: leading; reading events after id %d", self.hi)

    def _read_events(self) -> int:
        assert self.hi is not None
        with self.sessions() as s:
            rows = s.execute(
                select(Event.id, Event.kind)
                .where(Event.id > self.hi)
                .order_by(Event.id)
                .limit(self.batch)
            ).all()
            late = (
                s.execute(select(Event.id, Event.kind).where(Event.id.in_(list(self._gaps)))).all()
                if self._gaps
                else []
            )
        if not rows and not late:
            self._expire_gaps()
            return 0
        new_hi = rows[-1][0] if rows else self.hi
        wanted = [i for i, kind in (*late, *rows) if kind in EVIDENCE_KINDS]

        def work(s: Session) -> None:
            for ev in self._load(s, wanted):
                self.decider.handle(s, ev)
            if new_hi != self.hi:
                self._save_cursor(s, new_hi)

        try:
            self._tx(work)
        except OperationalError:
            raise
        except Exception:
            # One event the engine cannot handle must not stop all the others.
            log.exception("engine: a batch of %d events failed; retrying one by one", len(wanted))
            for eid in wanted:

                def one(s: Session, eid: int = eid) -> None:
                    for e in self._load(s, [eid]):
                        self.decider.handle(s, e)

                try:
                    self._tx(one)
                except OperationalError:
                    raise
                except Exception:
                    log.exception("engine: event %d skipped", eid)
                    self._error(f"event {eid} could not be handled")
            self._tx(lambda s: self._save_cursor(s, new_hi))
        present = {i for i, _ in rows}
        if rows and new_hi - self.hi <= MAX_GAP:
            now_m = time.monotonic()
            for i in range(self.hi + 1, new_hi):
                if i not in present:
                    self._gaps.setdefault(i, now_m)
        for i, _ in late:
            self._gaps.pop(i, None)
        self.hi = new_hi
        self._expire_gaps()
        return len(rows)

    def _expire_gaps(self) -> None:
        if self._gaps:
            cutoff = time.monotonic() - GAP_TTL_S
            self._gaps = {i: t for i, t in self._gaps.items() if t >= cutoff}

    def _load(self, s: Session, ids: list[int]) -> list[Evidence]:
        if not ids:
            return []
        rows = s.execute(
            select(Event, Node.name, Node.clock_offset_s)
            .outerjoin(Node, Node.id == Event.node_id)
            .where(Event.id.in_(ids))
            .order_by(Event.id)
        ).all()
        return [
            Evidence(
                kind=e.kind,
                ts=e.ts,
                received_at=e.received_at,
                node_id=e.node_id,
                node=name,
                job=e.job,
                rank=e.rank,
                xid=e.xid,
                gpu_uuid=e.gpu_uuid,
                message=e.message or "",
                data=dict(e.data or {}),
                event_id=e.id,
                clock_offset_s=offset,
            )
            for e, name, offset in rows
        ]

    def _save_cursor(self, s: Session, hi: int) -> None:
        state = s.get(EngineState, CURSOR, with_for_update=True, populate_existing=True)
        if state is None:
            s.add(EngineState(name=CURSOR, value={"hi": hi}, updated_at=self.clock()))
        else:
            state.value = {"hi": hi}
            state.updated_at = self.clock()

    # --- hooks --------------------------------------------------------------------------

    def _submit_hook(self, job: HookJob) -> None:
        self._running_hooks.add(job.key)
        timeout = self.policy.model.hooks.timeout_s

        def done(f: Future[HookResult]) -> None:
            try:
                result = f.result()
            except BaseException as exc:  # cancelled at shutdown, or a bug
                result = HookResult(job.hook, [], False, None, repr(exc), time.time(), 0.0)
            self._hook_results.put((job, result))
            self._wake.set()

        try:
            fut = self._hooks.submit(run_hook, job.hook, job.template, job.values, timeout)
        except RuntimeError:  # shutting down
            return
        fut.add_done_callback(done)

    def _hook_continuations(self) -> None:
        while True:
            try:
                job, result = self._hook_results.get_nowait()
            except queue.Empty:
                return

            def follow(s: Session, job: HookJob = job, result: HookResult = result) -> None:
                self.decider.after_hook(s, job, result)

            try:
                self._tx(follow)
            except Exception:
                self._hook_results.put((job, result))  # try again next cycle
                raise
            self._running_hooks.discard(job.key)

    # --- outputs --------------------------------------------------------------------------

    def _alert(self, inc: dict[str, Any]) -> None:
        """The alert webhooks for an incident a transaction changed (published after it)."""
        waiting = inc.get("job_state") == "waiting"
        now = (inc["status"], inc.get("escalations") or 0, waiting)
        seen = self._alerted.get(inc["id"])
        if seen is None and inc["created_at"] < self.started_at:
            # Opened before this replica led (a takeover): only changes from now on.
            seen = now
        before, escalations, was_waiting = seen if seen else (None, 0, False)
        self.alerts.incident_changed(
            before,
            inc,
            escalated=(inc.get("escalations") or 0) > escalations,
            waiting=waiting and not was_waiting,
        )
        self._alerted[inc["id"]] = now

    def status(self) -> dict[str, Any]:
        with self._stats_lock:
            stats = dict(self.decider.stats)
        lead = self.leadership
        return {
            "enabled": True,
            "leader": lead.is_leader,
            "leadership": getattr(lead, "kind", type(lead).__name__),
            "leader_since": getattr(lead, "acquired_at", None)
            if isinstance(lead, AdvisoryLockLeadership)
            else None,
            "replica": f"{socket.gethostname()}:{os.getpid()}",
            "running": self._thread is not None and self._thread.is_alive(),
            "sweep_s": self.sweep_s,
            "last_sweep_at": self.last_sweep_at,
            "cycles": self.cycles,
            "cursor": self.hi,
            "decisions": stats.get("decisions", 0) + stats.get("recommended", 0),
            "counts": stats,
            "errors": self.errors,
            "last_error": self.last_error,
            "policy": self.policy.summary(),
        }
