"""Carrying out decisions: command rows for the agents, cordon and hooks, giving up.

`Actions` holds what one engine transaction needs (policy, clock, scratch: the hooks it
made due, the incidents it touched, counters kept until the commit); `Decider` (decide.py)
builds on it. Hooks take seconds and must not hold a transaction: an action that needs
one records it as due (`hooks_due`); the engine runs it after the commit and continues
with `after_hook` in a later transaction.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.engine import queries as q
from backend.engine.hooks import HookResult
from backend.engine.policy import Policy
from backend.models import AuditLog, Command, Gpu, Incident, Job, Node

log = logging.getLogger(__name__)

ENGINE_ACTOR = "engine"


@dataclass(frozen=True)
class HookJob:
    """A hook to run after the commit, and what follows it."""

    incident_id: int
    acted_at: float  # the action it belongs to (a later escalation supersedes it)
    hook: str  # cordon | gpu_reset
    template: str
    values: dict[str, Any]
    exclude: frozenset[int]  # nodes the launcher restart that follows leaves out


class Actions:
    def __init__(self, policy: Policy, fresh_within_s: float, clock: Callable[[], float]) -> None:
        self.policy = policy
        self.fresh_within_s = fresh_within_s
        self.clock = clock
        self.stats: Counter[str] = Counter()
        self.begin()

    # --- per-transaction scratch ------------------------------------------------------

    def begin(self) -> None:
        self.hooks_due: list[HookJob] = []
        self.touched: set[int] = set()
        self.commands = 0
        self._tx: Counter[str] = Counter()

    def committed(self) -> None:
        # A new object, swapped in at once: readers in other threads (status, /metrics)
        # never see it change while they iterate.
        if self._tx:
            self.stats = self.stats + self._tx
        self._tx = Counter()

    def _count(self, key: str, n: int = 1) -> None:
        self._tx[key] += n

    # --- evidence -----------------------------------------------------------------------

    def act(
        self,
        session: Session,
        inc: Incident,
        job: Job,
        level: str,
        why: str,
        by: str,
        mode: str,
    ) -> None:
        """Carry out a decision now: commands, cordon and hooks, or giving up."""
        # Strictly later than the action it supersedes: acks are told apart by it.
        now = max(self.clock(), (inc.acted_at or 0.0) + 1e-6)
        restart = level != "stop_job"
        entry: dict[str, Any] = {
            "at": now,
            "level": level,
            "why": why,
            "by": by,
            "mode": mode,
            "restart": restart,
        }
        self.touched.add(inc.id)
        self._count("decisions")
        inc.decided_at = inc.decided_at or now
        inc.not_before = None
        if restart:
            inc.acted_at = now
            # A new action: the progress of a superseded one no longer counts.
            inc.torn_down_at = inc.restarted_at = inc.resumed_at = None
            inc.status = "open"
            inc.outcome = ""
            inc.closed_at = None
        if level == "stop_job":
            inc.level = "stop_job"
            inc.status = "stopped"
            inc.closed_at = now
            inc.outcome = f"stopped: {why}; no more automatic restarts, an operator must act"
            session.add(
                AuditLog(
                    ts=now,
                    actor=by,
                    action="stop_job",
                    target=f"job:{job.name}",
                    reason=f"incident {inc.id}: {why}"[:2000],
                )
            )
            log.warning("ALERT job %s stopped (incident %d): %s", job.name, inc.id, why)
            self._count("stopped")
        elif level == "reset_gpu":
            inc.level = "launcher"
            hook = self.policy.model.hooks.gpu_reset
            entry["hook"] = "gpu_reset"
            self._due(session, inc, job, "gpu_reset", hook, frozenset())
        elif level == "exclude_node":
            inc.level = "exclude_node"
            node_id = q.culprit_node(session, inc)
            inc.node_id = node_id
            exclude = frozenset({node_id}) if node_id is not None else frozenset()
            if node_id is not None:
                self._cordon(session, node_id, inc, by, why)
            hook = self.policy.model.hooks.cordon
            if hook and node_id is not None:
                entry["hook"] = "cordon"
                self._due(session, inc, job, "cordon", hook, exclude)
            else:
                self.issue(session, inc, job, "launcher", exclude)
        else:
            inc.level = level
            self.issue(session, inc, job, level, frozenset())
        inc.decisions = [*inc.decisions, entry]

    def issue(
        self, session: Session, inc: Incident, job: Job, action: str, exclude: frozenset[int]
    ) -> int:
        """Command rows for the agents of the nodes hosting the job (durable: an agent
        gets them when it next polls, after any reconnect)."""
        now = max(self.clock(), inc.acted_at or 0.0)  # never before the action they carry
        targets = q.job_nodes(session, job.id, now - self.fresh_within_s, exclude)
        if not targets:
            inc.status = "failed"
            inc.closed_at = now
            inc.outcome = (
                "no other node hosts ranks of the job"
                if exclude
                else ("no node hosts live ranks of the job: nothing to restart")
            )
            self._count("nothing_to_restart")
            return 0
        reason = f"incident {inc.id}: {inc.cause} -> {inc.level}"
        for node_id, ranks in sorted(targets.items()):
            session.add(
                Command(
                    id=uuid.uuid4().hex,
                    incident_id=inc.id,
                    job_id=job.id,
                    node_id=node_id,
                    action=action,
                    reason=reason[:256],
                    params={
                        "ranks": ",".join(map(str, ranks)),
                        "cause": inc.cause[:64],
                        "fault_at": inc.fault_at,
                        "attempt": inc.fault_attempt,
                        "iteration": inc.fault_iteration,
                    },
                    issued_at=now,
                )
            )
        self.commands += len(targets)
        self._count("commands", len(targets))
        return len(targets)

    def _cordon(self, session: Session, node_id: int, inc: Incident, by: str, why: str) -> None:
        node = session.get(Node, node_id, with_for_update=True)
        if node is None or node.cordoned:
            return
        node.cordoned = True
        session.add(
            AuditLog(
                ts=self.clock(),
                actor=by,
                action="cordon",
                target=f"node:{node.name}",
                reason=f"incident {inc.id}: {why}"[:2000],
            )
        )
        self._count("cordoned")

    def _due(
        self,
        session: Session,
        inc: Incident,
        job: Job,
        hook: str,
        template: str,
        exclude: frozenset[int],
    ) -> None:
        assert inc.acted_at is not None
        node = session.get(Node, inc.node_id) if inc.node_id is not None else None
        gpu_index = (
            session.scalar(select(Gpu.index).where(Gpu.uuid == inc.gpu_uuid))
            if inc.gpu_uuid
            else None
        )
        values = {
            "node": node.name if node is not None else "",
            "job": job.name,
            "gpu_uuid": inc.gpu_uuid or "",
            "gpu_index": gpu_index if gpu_index is not None and gpu_index >= 0 else "",
            "xid": inc.xid if inc.xid is not None else "",
            "incident": inc.id,
        }
        self.hooks_due.append(HookJob(inc.id, inc.acted_at, hook, template, values, exclude))

    def after_hook(self, session: Session, job_: HookJob, result: HookResult) -> None:
        """Record a hook's result and carry on: launcher restart after a cordon or a
        successful GPU reset; exclude the node when the reset failed."""
        inc = session.get(Incident, job_.incident_id, with_for_update=True)
        if inc is None:
            return
        inc.hooks = [*inc.hooks, result.record()]
        self.touched.add(inc.id)
        self._count(f"hook_{job_.hook}_{'ok' if result.ok else 'failed'}")
        if inc.status != "open" or inc.acted_at != job_.acted_at:
            return  # superseded by a later decision
        job = session.get(Job, inc.job_id)
        if job is None:
            return
        if job_.hook == "gpu_reset" and not result.ok:
            inc.escalations += 1
            self.act(
                session,
                inc,
                job,
                "exclude_node",
                f"GPU reset hook failed (rc {result.rc})",
                by=ENGINE_ACTOR,
                mode="auto",
            )
            return
        self.issue(session, inc, job, "launcher", job_.exclude)
