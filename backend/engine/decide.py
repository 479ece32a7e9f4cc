"""Decisions: evidence -> incident (a new one, or merged into the job's episode) -> the
level to act at (policy, escalation ladder, budget) -> recommend (dry run), wait
(cooldown) or act (actions.py).

Everything here runs inside one transaction of the engine (the leader). Statistics and
the set of incidents touched are kept per transaction and published by the engine only
once it committed.
"""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.engine import queries as q
from backend.engine.actions import ENGINE_ACTOR, Actions
from backend.engine.evidence import Evidence, Verdict, classify, describe
from backend.engine.policy import LADDER, next_level, rung
from backend.models import Incident, Job
from backend.models.control import ACTIVE_STATUSES, IncidentEvidence

log = logging.getLogger(__name__)

HOUR_S = 3600.0
__all__ = ["ENGINE_ACTOR", "Decider"]


class Decider(Actions):
    """Evidence in, decisions out (one transaction at a time)."""

    def handle(self, session: Session, ev: Evidence) -> None:
        verdict = classify(ev, self.policy)
        if verdict is None:
            return
        self._count("evidence")
        if ev.event_id is not None and session.scalar(
            select(IncidentEvidence.id).where(IncidentEvidence.event_id == ev.event_id)
        ):
            return  # already handled (read again after a change of leader)
        action, why = verdict.action, verdict.why
        now = self.clock()
        policy = self.policy.model
        if verdict.hard and ev.node_id is not None and rung(action) < rung("exclude_node"):
            window = policy.xid.repeat_window_s
            n = q.hard_xids_on_node(session, ev.node_id, ev.ts - window, ev.ts)
            if n >= policy.xid.repeat_count:
                action = "exclude_node"
                why = f"{n} hard XIDs on {ev.node} within {window:g} s (xid.repeat_count)"
        if action == "ignore":
            self._count("ignored")
            return
        offset = ev.clock_offset_s or 0.0
        # (A silent node is only evidence once it has been silent long enough; the sweep
        # bounds its age.)
        if ev.kind != "node_down" and (now + offset) - ev.ts > policy.incidents.max_evidence_age_s:
            self._count("stale")
            return
        if verdict.node_scoped:
            if ev.node_id is None:
                return
            since = (ev.ts - offset if ev.kind == "node_down" else now) - self.fresh_within_s
            pid = ev.data.get("pid")
            jobs = q.jobs_on_node(session, ev.node_id, since, pid if isinstance(pid, int) else None)
        else:
            job = session.scalar(select(Job).where(Job.name == ev.job))
            jobs = [job] if job is not None else []
        if not jobs:
            self._count("no_job")
            return
        for i, job in enumerate(jobs):
            self._apply(session, job, ev, verdict, action, why, primary=i == 0)

    def _apply(
        self,
        session: Session,
        job: Job,
        ev: Evidence,
        verdict: Verdict,
        action: str,
        why: str,
        primary: bool,
    ) -> None:
        inc = session.scalar(
            select(Incident)
            .where(Incident.job_id == job.id)
            .order_by(Incident.id.desc())
            .limit(1)
            .with_for_update()
        )
        if inc is not None and self._belongs(inc, ev):
            self._record(session, inc, ev, verdict, action, primary)
            self._merge(session, inc, job, ev, verdict, action, why)
        else:
            self._open(session, job, ev, verdict, action, why, primary)

    def _belongs(self, inc: Incident, ev: Evidence) -> bool:
        """Evidence joins the job's latest incident while it is being handled (or the
        job was given up); after it ended, only evidence of what happened before the
        job resumed (or, without a resumption, within the merge window of the fault)
        joins it: a fault after a successful restart is a new episode."""
        if inc.status in (*ACTIVE_STATUSES, "stopped"):
            return True
        if inc.resumed_at is not None:
            return ev.ts <= inc.resumed_at
        window = self.policy.model.incidents.merge_window_s
        return ev.ts <= (inc.fault_at or 0.0) + window

    def _record(
        self,
        session: Session,
        inc: Incident,
        ev: Evidence,
        verdict: Verdict,
        action: str,
        primary: bool,
    ) -> None:
        detail = describe(ev)
        if not primary and ev.event_id is not None:
            detail = f"{detail} (event {ev.event_id}, shared with other jobs on the node)"
        session.add(
            IncidentEvidence(
                incident_id=inc.id,
                event_id=ev.event_id if primary else None,
                kind=ev.kind,
                cause=verdict.cause,
                action=action,
                node_id=ev.node_id,
                rank=ev.rank,
                xid=ev.xid,
                ts=ev.ts,
                received_at=ev.received_at,
                detail=detail[:2000],
            )
        )
        self.touched.add(inc.id)

    def _open(
        self,
        session: Session,
        job: Job,
        ev: Evidence,
        verdict: Verdict,
        action: str,
        why: str,
        primary: bool,
    ) -> None:
        now = self.clock()
        fault_step = verdict.step if verdict.step is not None else job.last_step
        inc = Incident(
            job_id=job.id,
            created_at=now,
            trigger="auto",
            triggered_by=ENGINE_ACTOR,
            cause=verdict.cause,
            level=action,
            reason=f"{verdict.cause}: {describe(ev)}"[:2000],
            status="open",
            outcome="",
            fault_step=fault_step,
            fault_at=ev.ts,
            detected_at=ev.received_at,
            node_id=ev.node_id,
            gpu_uuid=ev.gpu_uuid,
            xid=ev.xid,
            fault_attempt=job.attempt,
            fault_iteration=job.iteration,
            escalations=0,
            decisions=[],
            hooks=[],
        )
        ckpt = q.last_checkpoint_step(session, job.name, ev.ts, fault_step)
        if ckpt is not None and fault_step is not None:
            inc.lost_steps = max(0, fault_step - ckpt)
        session.add(inc)
        session.flush()
        self._count("incidents")
        self._record(session, inc, ev, verdict, action, primary)
        self.decide(session, inc, job, action, why, in_episode=False)

    def _merge(
        self,
        session: Session,
        inc: Incident,
        job: Job,
        ev: Evidence,
        verdict: Verdict,
        action: str,
        why: str,
    ) -> None:
        self._count("merged")
        if inc.status not in ACTIVE_STATUSES:
            return  # late evidence of an episode that ended, or of a job given up
        effective = self._resolve(action)
        current = inc.level if inc.level in LADDER or inc.level == "reset_gpu" else "in_process"
        if rung(effective) <= rung(current):
            return  # same fault, or a consequence of the action already under way
        # Stronger evidence of the same episode: it decides now (no cooldown inside an
        # episode; the budget still applies).
        inc.cause = verdict.cause
        if verdict.node_scoped or effective == "exclude_node":
            inc.node_id = ev.node_id if ev.node_id is not None else inc.node_id
            inc.xid = ev.xid if ev.xid is not None else inc.xid
            inc.gpu_uuid = ev.gpu_uuid or inc.gpu_uuid
        note = f"stronger evidence: {verdict.cause} ({why})"
        if inc.acted_at is None and inc.status == "open":
            inc.level = effective  # still waiting for its cooldown: acts at the new level
            return
        inc.escalations += 1
        self.decide(session, inc, job, effective, note, in_episode=True)

    # --- deciding ---------------------------------------------------------------------

    def _resolve(self, action: str) -> str:
        if action == "reset_gpu" and not self.policy.model.hooks.gpu_reset:
            return "exclude_node"
        return action

    def plan(self, session: Session, job: Job, base: str, now: float) -> tuple[str, list[str]]:
        """The level to act at: the evidence's action, climbed by the escalation ladder
        (N earlier actions of a level within the window) and capped by the budget."""
        notes: list[str] = []
        level = self._resolve(base)
        if level != base:
            notes.append("no GPU reset hook configured: exclude the node")
        esc = self.policy.model.escalation
        while level in ("in_process", "launcher", "reset_gpu", "exclude_node"):
            counted = "launcher" if level == "reset_gpu" else level
            limit = self.policy.escalate_after(counted)
            n = q.actions_since(session, job.id, now - esc.window_s, counted)
            if limit is None or n < limit:
                break
            up = next_level(counted)
            notes.append(f"{n} {counted} actions within {esc.window_s:g} s: {up}")
            level = up
        budget = self.policy.model.limits.budget_per_hour
        if level != "stop_job":
            spent = q.actions_since(session, job.id, now - HOUR_S, None)
            if spent >= budget:
                notes.append(f"restart budget spent ({spent} of {budget} in the last hour)")
                level = "stop_job"
        return level, notes

    def decide(
        self,
        session: Session,
        inc: Incident,
        job: Job,
        base: str,
        why: str,
        in_episode: bool,
    ) -> None:
        """Decide on an incident: recommend (dry run), wait (cooldown) or act."""
        now = self.clock()
        level, notes = self.plan(session, job, base, now)
        why = "; ".join([why, *notes])
        inc.level = level
        self.touched.add(inc.id)
        if self.policy.dry_run:
            inc.status = "pending"
            inc.decided_at = inc.decided_at or now
            inc.outcome = f"recommended {level}: awaiting an operator's approval"
            inc.decisions = [
                *inc.decisions,
                {"at": now, "level": level, "why": why, "by": ENGINE_ACTOR, "mode": "dry_run"},
            ]
            self._count("recommended")
            return
        cooldown = self.policy.model.limits.cooldown_s
        last = q.last_action_at(session, job.id)
        if not in_episode and last is not None and now < last + cooldown and level != "stop_job":
            inc.not_before = last + cooldown
            inc.outcome = f"waiting for the job's cooldown ({cooldown:g} s after the last action)"
            inc.reason = inc.reason if why in inc.reason else f"{inc.reason} [{why}]"[:2000]
            self._count("deferred")
            return
        self.act(session, inc, job, level, why, by=ENGINE_ACTOR, mode="auto")
