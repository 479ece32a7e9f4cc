"""Decisions: evidence -> incident (a new one, or merged into the job's episode) -> the
level to act at (policy, escalation ladder, budget) -> recommend (dry run), wait
(cooldown) or act (actions.py).

Everything here runs inside one transaction of the engine (the leader). The incidents
change only through incidents.service; statistics are kept per transaction, and the
engine publishes the changed incidents once it committed.
"""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainguard.backend.analytics import repository as steps
from trainguard.backend.cluster.schemas import BackendEventKind
from trainguard.backend.engine import queries as q
from trainguard.backend.engine.actions import ENGINE_ACTOR, Actions
from trainguard.backend.engine.evidence import JOB_CAUSES, Evidence, Verdict, classify, describe
from trainguard.backend.engine.policy import next_level, rule_of, rung
from trainguard.backend.incidents import operators
from trainguard.backend.incidents import service as incidents
from trainguard.backend.jobs.service import capabilities, launcher_budget
from trainguard.backend.models import Event, Incident, Job, Node
from trainguard.backend.models.control import ACTIVE_STATUSES, LADDER, IncidentEvidence

log = logging.getLogger(__name__)

HOUR_S = 3600.0
SHADOW: BackendEventKind = "shadow"
# The levels that end the job's workers for their launcher to respawn: each uses one of
# the launcher's restarts (--max-restarts).
BUDGET_LEVELS = frozenset({"launcher", "reset_gpu", "exclude_node"})
__all__ = ["ENGINE_ACTOR", "Decider"]


class Decider(Actions):
    """Evidence in, decisions out (one transaction at a time)."""

    def handle(self, session: Session, ev: Evidence) -> None:
        verdict = classify(ev, self.policy)
        shadow = classify(ev, self.policy.shadow) if self.policy.shadow is not None else None
        if verdict is None and shadow is None:
            return
        if ev.event_id is not None and session.scalar(
            select(IncidentEvidence.id).where(IncidentEvidence.event_id == ev.event_id)
        ):
            return  # already handled (read again after a change of leader)
        if shadow is not None and (verdict is None or shadow.action != verdict.action):
            self._shadow(session, ev, verdict, shadow)
        if verdict is None:
            return
        self._count("evidence")
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

    def _shadow(
        self, session: Session, ev: Evidence, live: Verdict | None, shadow: Verdict
    ) -> None:
        """A shadow rule would act otherwise on this evidence: recorded as a `shadow`
        event ("would have done X"), never acted on. The incident the evidence joins
        shows it beside its real decisions (incidents.reads.shadow_decisions)."""
        instead = live.action if live is not None else "ignore"
        rule = rule_of(shadow.why)
        now = self.clock()
        session.add(
            Event(
                node_id=ev.node_id,
                ts=now,
                received_at=now,
                kind=SHADOW,
                job=ev.job,
                rank=ev.rank,
                xid=ev.xid,
                gpu_uuid=ev.gpu_uuid,
                message=f"shadow rule {rule}: would have done {shadow.action} "
                f"instead of {instead} on {shadow.cause}",
                data={
                    "rule": rule,
                    "action": shadow.action,
                    "instead_of": instead,
                    "cause": shadow.cause,
                    "event_id": ev.event_id,
                },
            )
        )
        self._count("shadow")

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
            .execution_options(populate_existing=True)
        )
        if inc is not None and self._belongs(inc, ev, verdict):
            self._record(session, inc, ev, verdict, action, primary)
            self._merge(session, inc, job, ev, verdict, action, why)
        else:
            self._open(session, job, ev, verdict, action, why, primary)

    def _belongs(self, inc: Incident, ev: Evidence, verdict: Verdict) -> bool:
        """Evidence joins the job's latest incident only when that incident caused it:
        the same node or GPU as its root, or the job's own ranks that died or raised
        within the merge window of its fault or after its action was taken (a restart
        ends ranks). A fault after the incident resumed is a new episode. A job given up
        (stop_job) keeps its incident: later evidence is recorded there, not acted on."""
        if inc.status == "stopped":
            return True
        if inc.resumed_at is not None and ev.ts > inc.resumed_at:
            return False
        fault = inc.fault_at if inc.fault_at is not None else inc.created_at
        window = self.policy.model.incidents.merge_window_s
        if inc.status not in ACTIVE_STATUSES and inc.resumed_at is None and ev.ts > fault + window:
            return False  # ended without a resumption: only what came with the fault
        same_place = ev.node_id is not None and ev.node_id == inc.node_id
        if same_place and ev.gpu_uuid and inc.gpu_uuid and ev.gpu_uuid != inc.gpu_uuid:
            same_place = verdict.cause == "node_down"  # another GPU: its own fault
        if same_place:
            return True
        if verdict.node_scoped:
            return False  # another node's hardware: its own fault
        if fault - 1.0 <= ev.ts <= fault + window:
            return True  # the job's ranks that died or raised with the fault
        acted = inc.acted_at
        return acted is not None and ev.ts >= acted - 1.0 and inc.status in ACTIVE_STATUSES

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
        incidents.add_evidence(
            session,
            inc,
            ev,
            cause=verdict.cause,
            action=action,
            detail=detail,
            event_id=ev.event_id if primary else None,
        )

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
        ckpt = q.last_checkpoint_step(session, job.name, ev.ts, fault_step)
        lost = max(0, fault_step - ckpt) if ckpt is not None and fault_step is not None else None
        inc = incidents.open_incident(
            session,
            job,
            now=now,
            trigger="auto",
            triggered_by=ENGINE_ACTOR,
            cause=verdict.cause,
            level=action,
            reason=f"{verdict.cause}: {describe(ev)}",
            fault_at=ev.ts,
            detected_at=ev.received_at,
            fault_step=fault_step,
            lost_steps=lost,
            node_id=ev.node_id,
            gpu_uuid=ev.gpu_uuid,
            xid=ev.xid,
        )
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
        """Evidence of the same episode. The root (cause, reason, node, fault_at) stays;
        stronger evidence escalates the action, recorded as a decision."""
        self._count("merged")
        if inc.status not in ACTIVE_STATUSES:
            return  # late evidence of an episode that ended, or of a job given up
        effective = self._resolve(action)
        current = inc.level if inc.level in LADDER or inc.level == "reset_gpu" else "in_process"
        if rung(effective) <= rung(current):
            return  # same fault, or a consequence of the action already under way
        note = f"stronger evidence: {verdict.cause} on {ev.node or '?'} ({why})"
        if inc.acted_at is None and inc.status == "open":
            # Still waiting for its cooldown: acts at the new level.
            incidents.raise_level(session, inc, effective, note)
            return
        incidents.escalate(session, inc)
        self.decide(session, inc, job, effective, note, in_episode=True)

    # --- deciding ---------------------------------------------------------------------

    def _resolve(self, action: str) -> str:
        if action == "reset_gpu" and not self.policy.model.hooks.gpu_reset:
            return "exclude_node"
        return action

    def plan(
        self, session: Session, inc: Incident, job: Job, base: str, now: float
    ) -> tuple[str, list[str]]:
        """The level to act at: the evidence's action, kept to what the job can carry
        out and to what the evidence allows (exclude_node only on evidence about a node's
        hardware), climbed by the escalation ladder (N earlier actions of a level within
        the window) and capped by the budget."""
        notes: list[str] = []
        hardware = bool(q.hardware_nodes(session, inc))
        level = self._resolve(base)
        if level != base:
            notes.append("no GPU reset hook configured: exclude the node")
        if level in ("exclude_node", "reset_gpu") and not hardware:
            notes.append("no evidence against a node's hardware: no node is excluded")
            level = "launcher"
        caps = capabilities(session, job.id, now - self.fresh_within_s)
        if level == "in_process" and "in_process" not in caps["levels"]:
            notes.append("not every live rank runs under NVRx's Wrapper: launcher")
            level = "launcher"
        esc = self.policy.model.escalation
        culprit = self._culprit_name(session, inc)
        while level in ("in_process", "launcher", "reset_gpu", "exclude_node"):
            counted = "launcher" if level == "reset_gpu" else level
            limit = self.policy.escalate_after(counted)
            # Exclusions climb when the same node needs one again (it came back and failed
            # again); independent faults on other nodes are the breaker's business.
            about = culprit if counted == "exclude_node" else None
            n = q.actions_since(session, job.id, now - esc.window_s, counted, about)
            if limit is None or n < limit:
                break
            up = next_level(counted, hardware)
            of = f" of {about}" if about else ""
            notes.append(f"{n} {counted} actions{of} within {esc.window_s:g} s: {up}")
            level = up
        if level == "launcher" and "launcher" not in caps["levels"]:
            notes.append("no launcher respawns the job's ranks: stop_job")
            level = "stop_job"
        if level == "launcher" and "in_process" in caps["levels"]:
            launcher = launcher_budget(session, job.id, now - self.fresh_within_s)
            if _last_restart(launcher) and not self._ladder_passed(session, job, now, "in_process"):
                notes.append(f"{operators.budget_text(launcher)}: in_process instead")
                level = "in_process"
        budget = self.policy.model.limits.budget_per_hour
        if level != "stop_job":
            spent = q.actions_since(session, job.id, now - HOUR_S, None)
            if spent >= budget:
                notes.append(f"restart budget spent ({spent} of {budget} in the last hour)")
                level = "stop_job"
        return level, notes

    def _culprit_name(self, session: Session, inc: Incident) -> str | None:
        node_id = q.culprit_node(session, inc)
        node = session.get(Node, node_id) if node_id is not None else None
        return node.name if node is not None else None

    def _ladder_passed(self, session: Session, job: Job, now: float, level: str) -> bool:
        """Whether the escalation ladder has climbed past `level` for this job."""
        limit = self.policy.escalate_after(level)
        window = self.policy.model.escalation.window_s
        return limit is not None and q.actions_since(session, job.id, now - window, level) >= limit

    def _budget_held(self, session: Session, inc: Incident, job: Job, level: str, why: str) -> bool:
        """The launcher's restart budget: a decision that would end the job's workers for
        its launcher to respawn (launcher, reset_gpu, exclude_node) with one launcher
        restart left or none waits for an operator (pending; approving it carries it
        out, using the last one). An escalation during an action already taken goes on:
        its launcher restarts the ranks that died anyway."""
        if level not in BUDGET_LEVELS or inc.acted_at is not None:
            return False
        budget = launcher_budget(session, job.id, self.clock() - self.fresh_within_s)
        if not _last_restart(budget):
            return False
        now = self.clock()
        text = operators.budget_text(budget)
        incidents.hold(
            session,
            inc,
            now,
            f"{level} restart waits for an operator: {text} (approve to use it, or relaunch "
            "the job with a larger --max-restarts)",
            {
                "at": now,
                "level": level,
                "why": f"{why}; held: {text}",
                "by": ENGINE_ACTOR,
                "mode": "budget",
                "restart": False,
            },
            level=level,
        )
        log.warning("ALERT incident %d: %s", inc.id, inc.outcome)
        self._count("budget_held")
        return True

    def recovered_itself(self, session: Session, inc: Incident) -> bool:
        """Resolve an incident not acted on yet whose job restarted by itself (NVRx's
        Wrapper after an exception, the launcher after a rank death) and made a step:
        acting now would restart a job that already recovered."""
        if inc.acted_at is not None or inc.cause not in JOB_CAUSES:
            return False
        first = steps.recovered_by_itself(session, inc)
        if first is None:
            return False
        now = self.clock()
        incidents.resolve(
            session,
            inc,
            now,
            "recovered by itself (NVRx's Wrapper or the job's launcher restarted it) "
            "before trainguard acted; no command sent",
            resumed_at=first.end,
            resumed_step=first.step,
        )
        incidents.add_decision(
            session,
            inc,
            {
                "at": now,
                "level": "none",
                "why": f"the job resumed at step {first.step} in a new generation",
                "by": ENGINE_ACTOR,
                "mode": "observed",
                "restart": False,
            },
        )
        self._count("recovered_itself")
        return True

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
        if self.recovered_itself(session, inc):
            return
        level, notes = self.plan(session, inc, job, base, now)
        why = "; ".join([why, *notes])
        incidents.set_level(session, inc, level)
        if self.policy.dry_run:
            incidents.recommend(session, inc, why, now, by=ENGINE_ACTOR)
            self._count("recommended")
            return
        cooldown = self.policy.model.limits.cooldown_s
        last = q.last_action_at(session, job.id)
        if not in_episode and last is not None and now < last + cooldown and level != "stop_job":
            incidents.defer(
                session,
                inc,
                last + cooldown,
                why,
                f"waiting for the job's cooldown ({cooldown:g} s after the last action)",
            )
            self._count("deferred")
            return
        if self._budget_held(session, inc, job, level, why):
            return
        self.act(session, inc, job, level, why, by=ENGINE_ACTOR, mode="auto")


def _last_restart(budget: dict[str, int | None]) -> bool:
    """One launcher restart left, or none (known from the job's live ranks)."""
    left = budget["restarts_left"]
    return left is not None and left <= operators.LAST_LAUNCHER_RESTART
