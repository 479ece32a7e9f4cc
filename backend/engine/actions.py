"""Carrying out decisions: command rows for the agents, cordon and hooks, giving up.

`Actions` holds what one engine transaction needs (policy, clock, scratch: the hooks it
made due, the commands it issued, counters kept until the commit); `Decider` (decide.py)
builds on it. Incidents change, and commands are made, only through incidents.service.
Hooks take seconds and must not hold a transaction: an action that needs one records it
as due (`hooks_due`); the engine runs it after the commit and continues with
`after_hook` in a later transaction.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainguard.backend import audit
from trainguard.backend.cluster import cordons
from trainguard.backend.engine import queries as q
from trainguard.backend.engine.policy import Policy
from trainguard.backend.hooks import HookResult
from trainguard.backend.incidents import acks
from trainguard.backend.incidents import service as incidents
from trainguard.backend.jobs.service import set_job_state
from trainguard.backend.models import JOB_ENDED, Gpu, Incident, Job, Node

log = logging.getLogger(__name__)

ENGINE_ACTOR = "engine"
# Outcome prefixes the sweeps recognise an incident's wait by (sweep.py, lifecycle.py).
WAITING = "waiting: no schedulable node"
NO_RANK = "no live rank of the job to restart"


@dataclass(frozen=True)
class HookJob:
    """A hook to run after the commit, and what follows it."""

    incident_id: int  # 0 for a node's hook (health_check, uncordon)
    acted_at: float  # the action it belongs to (a later escalation supersedes it)
    hook: str  # cordon | gpu_reset | health_check | uncordon
    template: str
    values: dict[str, Any]
    exclude: frozenset[int]  # nodes the launcher restart that follows leaves out
    node_id: int | None = None  # the node of a node's hook

    @property
    def key(self) -> tuple[int, float]:
        return (-self.node_id, self.acted_at) if self.node_id else (self.incident_id, self.acted_at)


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
        if level == "exclude_node" and mode == "auto" and self._held(session, inc, why):
            return
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
        self._count("decisions")
        incidents.take_action(session, inc, now, restart)
        if level == "stop_job":
            incidents.stop(session, inc, now, why)
            audit.record(
                session,
                ts=now,
                actor=by,
                action="stop_job",
                target=f"job:{job.name}",
                reason=f"incident {inc.id}: {why}"[:2000],
            )
            log.warning("ALERT job %s stopped (incident %d): %s", job.name, inc.id, why)
            self._stop_launchers(session, inc, job, why, now)
            self._count("stopped")
        elif level == "reset_gpu":
            incidents.set_level(session, inc, "launcher")
            hook = self.policy.model.hooks.gpu_reset
            entry["hook"] = "gpu_reset"
            self._due(session, inc, job, "gpu_reset", hook, frozenset())
        elif level == "exclude_node":
            self._exclude(session, inc, job, why, by, mode, entry)
        else:
            incidents.set_level(session, inc, level)
            self.issue(session, inc, job, level, frozenset())
        incidents.add_decision(session, inc, entry)

    def _stop_launchers(
        self, session: Session, inc: Incident, job: Job, why: str, now: float
    ) -> None:
        """stop_job ends the job through its launchers: a stop_job command to the agent of
        every node with its ranks (acks: incidents.acks.record_stop). Without one to send, the
        job's state says what is true: its launcher goes on by itself."""
        targets = q.job_nodes(session, job.id, now - self.fresh_within_s, frozenset())
        reason = f"incident {inc.id}: {why}"
        if not targets:
            set_job_state(job, "stopped", now, f"{reason}; {acks.STILL_RESTARTS}")
            return
        set_job_state(job, "stopped", now, f"{reason}; {acks.ENDING_LAUNCHER}")
        n = incidents.issue_commands(session, inc, "stop_job", targets, now, reason, fault=False)
        self.commands += n
        self._count("commands", n)

    def _exclude(
        self,
        session: Session,
        inc: Incident,
        job: Job,
        why: str,
        by: str,
        mode: str,
        entry: dict[str, Any],
    ) -> None:
        """Cordon the node of the incident's hardware evidence, then a launcher restart
        without it. Automatic cordons pass the breaker first; past its cap the exclusion
        waits for an operator (pending). Without such evidence no node is cordoned."""
        incidents.set_level(session, inc, "exclude_node")
        node_id = q.culprit_node(session, inc)
        if node_id is None:
            entry["why"] = f"{why}; no evidence against a node's hardware: launcher restart"
            incidents.set_level(session, inc, "launcher")
            self.issue(session, inc, job, "launcher", frozenset())
            return
        node = session.get(Node, node_id, with_for_update=True, populate_existing=True)
        entry["node"] = node.name if node is not None else None
        exclude = frozenset({node_id})
        if node is not None:
            self.cordon(session, node, by, f"incident {inc.id}: {why}", inc)
            self._leave(session, inc, job, node, entry)
        hook = self.policy.model.hooks.cordon
        if hook and node is not None:
            entry["hook"] = "cordon"
            self._due(session, inc, job, "cordon", hook, exclude)
        else:
            self.issue(session, inc, job, "launcher", exclude)

    def _leave(
        self, session: Session, inc: Incident, job: Job, node: Node, entry: dict[str, Any]
    ) -> None:
        """The excluded node leaves the job (incidents.service.leave_job). The job
        re-forms without it through the launcher restart of its other nodes: on a spare
        launcher, or with fewer nodes where it is elastic; the job's only node waits and,
        readmitted, restarts it in place."""
        now = max(self.clock(), inc.acted_at or 0.0)
        hosts = q.job_nodes(session, job.id, now - self.fresh_within_s)
        if set(hosts) == {node.id}:
            # Not the job's only node if another one's ranks train on unheard (its agent
            # silent): its launcher re-forms the job without this one.
            for other in q.live_elsewhere(session, job.id, {node.id}):
                hosts.setdefault(other, [])
        grace = self.policy.model.escalation.leave_grace_s
        n = incidents.leave_job(session, inc, job, node, hosts, now, grace, entry)
        self.commands += n
        self._count("commands", n)

    def _held(self, session: Session, inc: Incident, why: str) -> bool:
        """The breaker: an automatic exclusion past the cap waits for an operator (the
        incident goes pending; approving it carries the exclusion out)."""
        node_id = q.culprit_node(session, inc)
        node = session.get(Node, node_id) if node_id is not None else None
        if node is None or node.cordoned:
            return False
        cap, used = self.breaker(session)
        if used < cap:
            return False
        now = self.clock()
        window = self.policy.model.breaker.window_s
        incidents.hold(
            session,
            inc,
            now,
            f"exclusion of {node.name} waits for an operator: {used} automatic cordons "
            f"within {window:g} s reach the breaker's cap of {cap} (approve or reject)",
            {
                "at": now,
                "level": "exclude_node",
                "why": f"{why}; held by the breaker",
                "by": ENGINE_ACTOR,
                "mode": "breaker",
                "node": node.name,
                "restart": False,
            },
        )
        log.warning("ALERT incident %d: %s", inc.id, inc.outcome)
        self._count("breaker_held")
        return True

    def breaker(self, session: Session) -> tuple[int, int]:
        """(cap, used): automatic cordons allowed and taken in the breaker's window."""
        b = self.policy.model.breaker
        cap = max(1, int(b.max_fraction * q.cluster_size(session)))
        return cap, q.engine_cordons_since(session, self.clock() - b.window_s)

    def issue(
        self, session: Session, inc: Incident, job: Job, action: str, exclude: frozenset[int]
    ) -> int:
        """Commands for the agents of the nodes hosting the job, the excluded nodes left
        out; how many (0: the incident waits for capacity or for a new generation)."""
        now = max(self.clock(), inc.acted_at or 0.0)  # never before the action they carry
        if job.ended_at is not None and job.state in JOB_ENDED:
            # An exclusion approved after its job ended (lifecycle's node-only question):
            # the cordon was the whole of it.
            cordoned = ", ".join(
                sorted(n.name for n in (session.get(Node, i) for i in exclude) if n)
            )
            done = f"cordoned {cordoned}; " if cordoned else ""
            incidents.resolve(
                session, inc, now, f"{done}the job had {job.state}: nothing is restarted"
            )
            return 0
        targets = q.job_nodes(session, job.id, now - self.fresh_within_s, exclude)
        if not targets and exclude:
            # Nodes whose agent is silent while their ranks train on: their commands wait
            # for the agent's next poll (durable), the job has capacity there.
            targets = q.live_elsewhere(session, job.id, exclude)
        if not targets and exclude:
            # The excluded node was the job's last: no schedulable capacity is left. The
            # job waits (one alert), the incident stays open until capacity comes back.
            self._wait_for_capacity(session, inc, job, exclude)
            return 0
        if not targets:
            # No rank reported lately anywhere: the job's launcher is between generations
            # (or gave up). Wait for its new generation; the sweep resolves or ends it.
            wait = self.policy.model.escalation.relaunch_wait_s
            incidents.wait(
                session,
                inc,
                now + wait,
                f"{NO_RANK}: waiting up to {wait:g} s for its launcher's new generation",
            )
            self._count("nothing_to_restart")
            return 0
        reason = f"incident {inc.id}: {inc.cause} -> {inc.level}"
        n = incidents.issue_commands(session, inc, action, targets, now, reason, fault=True)
        self.commands += n
        self._count("commands", n)
        return n

    def _wait_for_capacity(
        self, session: Session, inc: Incident, job: Job, exclude: frozenset[int]
    ) -> None:
        names = sorted(n.name for n in (session.get(Node, i) for i in exclude) if n)
        incidents.note(
            session,
            inc,
            f"{WAITING} is left for the job ({', '.join(names)} "
            "cordoned); it restarts when a node is readmitted",
        )
        if job.state != "waiting":
            set_job_state(job, "waiting", self.clock(), inc.outcome)
            log.warning("ALERT job %s waiting (incident %d): %s", job.name, inc.id, inc.outcome)
            self._count("waiting")

    def cordon(
        self, session: Session, node: Node, by: str, reason: str, inc: Incident | None
    ) -> None:
        """Cordon a node (no new work), with its reason and evidence kept in its history."""
        evidence = "; ".join(d for _, d in q.hardware_nodes(session, inc)[:3]) if inc else ""
        row = cordons.cordon(
            session,
            node,
            by,
            reason,
            self.clock(),
            incident_id=inc.id if inc is not None else None,
            evidence=evidence,
        )
        if row is not None:
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
        successful GPU reset; exclude the node when the reset failed; a node's
        readmission after its health check passed."""
        if job_.node_id is not None:
            self.after_node_hook(session, job_, result)
            return
        inc = session.get(Incident, job_.incident_id, with_for_update=True, populate_existing=True)
        if inc is None:
            return
        incidents.add_hook_result(session, inc, result.record())
        self._count(f"hook_{job_.hook}_{'ok' if result.ok else 'failed'}")
        if inc.status != "open" or inc.acted_at != job_.acted_at:
            return  # superseded by a later decision
        job = session.get(Job, inc.job_id)
        if job is None:
            return
        if job_.hook == "gpu_reset" and not result.ok:
            incidents.escalate(session, inc)
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

    def after_node_hook(self, session: Session, job_: HookJob, result: HookResult) -> None:
        node = session.get(Node, job_.node_id, with_for_update=True, populate_existing=True)
        if node is None:
            return
        self._count(f"hook_{job_.hook}_{'ok' if result.ok else 'failed'}")
        now = self.clock()
        verdict = "passed" if result.ok else f"failed (rc {result.rc})"
        audit.record(
            session,
            ts=now,
            actor=ENGINE_ACTOR,
            action=f"hook:{job_.hook}",
            target=f"node:{node.name}",
            reason=f"{' '.join(result.command)[:500]}: {verdict}: {result.output[:500]}",
        )
        if job_.hook == "health_check" and result.ok:
            self.readmit_node(session, node, "health check passed")

    def readmit_node(self, session: Session, node: Node, why: str) -> None:
        """Readmit a node the engine cordoned; the uncordon hook runs after the commit."""
        now = self.clock()
        if not cordons.readmit(
            session, node, ENGINE_ACTOR, f"readmitted automatically: {why}", now
        ):
            return
        self._count("readmitted")
        hook = self.policy.model.hooks.uncordon
        if hook:
            self.hooks_due.append(
                HookJob(0, now, "uncordon", hook, {"node": node.name}, frozenset(), node.id)
            )
