"""Incidents: every change of an incident happens here, whoever decides it.

The engine (backend/engine) decides what to do about evidence and calls these
transitions; the operator's routes (manual restart, approve, reject) and the agents'
acks call them too. Each transition marks its incident as changed (publish.py), so that
every change is published once, after its commit. `issue_commands` is the one place
Command rows are made, for the engine's actions and the operator's restarts alike.

    open_incident -> add_evidence* -> (set_level | raise_level | escalate)
      -> recommend (dry run: pending) -> approve | reject
      -> defer (cooldown) / hold (breaker: pending)
      -> take_action -> issue_commands, or stop (stop_job)
      -> record_phase (acks) -> resolve | fail | wait_for_relaunch
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainguard.backend.engine.evidence import Evidence
from trainguard.backend.engine.queries import capabilities, launcher_budget
from trainguard.backend.errors import Conflict, NotFound
from trainguard.backend.incidents import reads
from trainguard.backend.incidents.publish import changed
from trainguard.backend.jobs.service import get_or_create_job, live_ranks, set_job_state
from trainguard.backend.models import TIMELINE, AuditLog, Command, CommandAck, Incident, Job, Node
from trainguard.backend.models.control import IncidentEvidence
from trainguard.protocol import wire

# Which incident field each ack phase fills: the first delivery, the last of the others
# (a phase is complete when every node has done it).
_PHASE_FIELD = {
    "delivered": "delivered_at",
    "torn_down": "torn_down_at",
    "restarted": "restarted_at",
    "resumed": "resumed_at",
}


# --- opening, evidence ----------------------------------------------------------------


def open_incident(
    session: Session,
    job: Job,
    *,
    now: float,
    trigger: str,
    triggered_by: str,
    cause: str,
    level: str,
    reason: str,
    fault_at: float,
    detected_at: float,
    fault_step: int | None,
    lost_steps: int | None = None,
    node_id: int | None = None,
    gpu_uuid: str | None = None,
    xid: int | None = None,
) -> Incident:
    """A new incident (open) of a job, at the job's current generation."""
    inc = Incident(
        job_id=job.id,
        created_at=now,
        trigger=trigger,
        triggered_by=triggered_by,
        cause=cause,
        level=level,
        reason=reason[:2000],
        status="open",
        outcome="",
        fault_step=fault_step,
        lost_steps=lost_steps,
        fault_at=fault_at,
        detected_at=detected_at,
        node_id=node_id,
        gpu_uuid=gpu_uuid,
        xid=xid,
        fault_attempt=job.attempt,
        fault_iteration=job.iteration,
        escalations=0,
        decisions=[],
        hooks=[],
    )
    session.add(inc)
    session.flush()
    changed(session, inc)
    return inc


def add_evidence(
    session: Session,
    inc: Incident,
    ev: Evidence,
    *,
    cause: str,
    action: str,
    detail: str,
    event_id: int | None,
) -> None:
    """One piece of evidence joins the incident (`event_id`: the event it was read from,
    None when another job's incident already holds that event)."""
    session.add(
        IncidentEvidence(
            incident_id=inc.id,
            event_id=event_id,
            kind=ev.kind,
            cause=cause,
            action=action,
            node_id=ev.node_id,
            rank=ev.rank,
            xid=ev.xid,
            ts=ev.ts,
            received_at=ev.received_at,
            detail=detail[:2000],
        )
    )
    changed(session, inc)


# --- deciding ---------------------------------------------------------------------------


def set_level(session: Session, inc: Incident, level: str) -> None:
    """The level the incident is (to be) acted at."""
    inc.level = level
    changed(session, inc)


def raise_level(session: Session, inc: Incident, level: str, why: str) -> None:
    """Stronger evidence before the incident was acted on: it acts at `level`."""
    inc.level = level
    _append_reason(inc, why)
    changed(session, inc)


def escalate(session: Session, inc: Incident) -> None:
    """Count one escalation (a stronger action within the episode)."""
    inc.escalations += 1
    changed(session, inc)


def note(session: Session, inc: Incident, outcome: str) -> None:
    """Say where the incident stands (its outcome so far) without changing its status."""
    inc.outcome = outcome
    changed(session, inc)


def add_decision(session: Session, inc: Incident, entry: Mapping[str, Any]) -> None:
    inc.decisions = [*inc.decisions, dict(entry)]
    changed(session, inc)


def recommend(session: Session, inc: Incident, why: str, now: float, by: str) -> None:
    """Dry run: the incident's level is only recommended; it waits for an operator."""
    inc.status = "pending"
    inc.decided_at = inc.decided_at or now
    inc.outcome = f"recommended {inc.level}: awaiting an operator's approval"
    add_decision(
        session, inc, {"at": now, "level": inc.level, "why": why, "by": by, "mode": "dry_run"}
    )


def defer(session: Session, inc: Incident, until: float, why: str, outcome: str) -> None:
    """Not acted on before `until` (the job's cooldown)."""
    inc.not_before = until
    inc.outcome = outcome
    _append_reason(inc, why)
    changed(session, inc)


def hold(
    session: Session,
    inc: Incident,
    now: float,
    outcome: str,
    entry: dict[str, Any],
    level: str = "exclude_node",
) -> None:
    """A decision held for an operator (an exclusion past the breaker's cap, a restart
    that would use the launcher's last one): pending until an operator approves or
    rejects."""
    inc.level = level
    inc.status = "pending"
    inc.decided_at = inc.decided_at or now
    inc.not_before = None
    inc.outcome = outcome
    add_decision(session, inc, entry)


def take_action(session: Session, inc: Incident, now: float, restart: bool) -> None:
    """A decision is carried out now. A restart is a new action: the progress of the one
    it supersedes no longer counts, and acks are told apart by `acted_at`."""
    inc.decided_at = inc.decided_at or now
    inc.not_before = None
    if restart:
        inc.acted_at = now
        inc.torn_down_at = inc.restarted_at = inc.resumed_at = None
        inc.status = "open"
        inc.outcome = ""
        inc.closed_at = None
    changed(session, inc)


def stop(session: Session, inc: Incident, now: float, why: str) -> None:
    """stop_job: no more automatic restarts of the job."""
    inc.level = "stop_job"
    inc.status = "stopped"
    inc.closed_at = now
    inc.outcome = f"stopped: {why}; no more automatic restarts, an operator must act"
    changed(session, inc)


def wait(session: Session, inc: Incident, until: float | None, outcome: str | None = None) -> None:
    """The incident waits until `until` (None: no longer) for something to happen."""
    inc.not_before = until
    if outcome is not None:
        inc.outcome = outcome
    changed(session, inc)


def add_hook_result(session: Session, inc: Incident, record: dict[str, Any]) -> None:
    inc.hooks = [*inc.hooks, record]
    changed(session, inc)


def _append_reason(inc: Incident, text: str) -> None:
    if text not in inc.reason:
        inc.reason = f"{inc.reason} [{text}]"[:2000]


# --- operators' answers -------------------------------------------------------------------


def approve(session: Session, incident_id: int, who: str, reason: str) -> Incident:
    """Approve a pending incident: the engine carries its level out at its next cycle."""
    inc = _pending(session, incident_id)
    now = _answer(session, inc, who, reason, "approval", "approve")
    inc.status = "open"
    inc.not_before = now
    inc.outcome = f"approved by {who}"
    session.flush()
    return inc


def reject(session: Session, incident_id: int, who: str, reason: str) -> Incident:
    inc = _pending(session, incident_id)
    now = _answer(session, inc, who, reason, "rejection", "reject")
    inc.status = "rejected"
    inc.closed_at = now
    inc.outcome = f"rejected by {who}: {reason}"
    session.flush()
    return inc


def _pending(session: Session, incident_id: int) -> Incident:
    inc = session.get(Incident, incident_id, with_for_update=True, populate_existing=True)
    if inc is None:
        raise NotFound(f"no incident {incident_id}")
    if inc.status != "pending":
        raise Conflict(f"incident {incident_id} is {inc.status}, not awaiting approval")
    return inc


def _answer(session: Session, inc: Incident, who: str, reason: str, mode: str, verb: str) -> float:
    """An operator's answer to a recommendation: a decision entry and an audit row."""
    now = time.time()
    add_decision(
        session, inc, {"at": now, "level": inc.level, "why": reason, "by": who, "mode": mode}
    )
    session.add(
        AuditLog(
            ts=now,
            actor=who,
            action=f"{verb}:{inc.level}",
            target=f"incident:{inc.id}",
            reason=reason,
        )
    )
    return now


# --- commands -----------------------------------------------------------------------------


def issue_commands(
    session: Session,
    inc: Incident,
    action: str,
    targets: Mapping[int, list[int]],
    now: float,
    reason: str,
    *,
    fault: bool,
) -> int:
    """The one place Command rows are made: one per node of `targets` ({node id: the
    job's ranks there}), durable, so an agent gets its command when it next polls, after
    any reconnect. With `fault`, each also carries the fault's generation (cause,
    fault_at, attempt, iteration): the agent acks a restart that happened since as served
    (an automatic action can come after the job restarted by itself). A manual restart
    has no earlier fault: it restarts what runs now. Returns how many were made."""
    for node_id, ranks in sorted(targets.items()):
        # wire.Command params are scalars: the ranks travel as "0,1".
        params: dict[str, Any] = {"ranks": ",".join(map(str, sorted(ranks)))}
        if fault:
            params |= {
                "cause": inc.cause[:64],
                "fault_at": inc.fault_at,
                "attempt": inc.fault_attempt,
                "iteration": inc.fault_iteration,
            }
        session.add(
            Command(
                id=uuid.uuid4().hex,
                incident_id=inc.id,
                job_id=inc.job_id,
                node_id=node_id,
                action=action,
                reason=reason[:256],
                params=params,
                issued_at=now,
            )
        )
    return len(targets)


def manual_restart(
    session: Session,
    job: Job,
    level: str,
    reason: str,
    actor: str,
    fresh_within_s: float,
    force: bool = False,
) -> Incident:
    """An operator's restart: an incident opened and acted on at once, at `level`, on
    every node with live ranks of the job (audited). A launcher restart that would use
    the launcher's last restart (restarts left <= 1) is refused unless `force`."""
    ranks = live_ranks(session, job, fresh_within_s)
    if not ranks:
        raise Conflict(f"job {job.name!r} has no live ranks to restart")
    now = time.time()
    caps = capabilities(session, job.id, now - fresh_within_s)
    if level not in caps["levels"]:
        raise Conflict(
            f"job {job.name!r} cannot carry out {_a(level)} {level} restart: {why_not(level, caps)}"
        )
    if level == "launcher":
        budget = launcher_budget(session, job.id, now - fresh_within_s)
        left = budget["restarts_left"]
        if left is not None and left <= LAST_LAUNCHER_RESTART:
            if not force:
                raise Conflict(
                    f"job {job.name!r}: {budget_text(budget)}; relaunch the job with a larger "
                    "--max-restarts to raise the budget, or send force: true to use it anyway",
                    code=RESTART_BUDGET,
                )
            reason = f"{reason} (forced: {budget_text(budget)})"
    inc = open_incident(
        session,
        job,
        now=now,
        trigger="manual",
        triggered_by=actor,
        cause="operator",
        level=level,
        reason=reason,
        fault_at=now,
        detected_at=now,
        fault_step=job.last_step,
    )
    take_action(session, inc, now, restart=True)
    add_decision(
        session,
        inc,
        {"at": now, "level": level, "why": reason, "by": actor, "mode": "manual", "restart": True},
    )
    targets: dict[int, list[int]] = {}
    for rank, _ in ranks:
        targets.setdefault(rank.node_id, []).append(rank.rank)
    issue_commands(session, inc, level, targets, now, reason, fault=False)
    session.add(
        AuditLog(
            ts=now, actor=actor, action=f"restart:{level}", target=f"job:{job.name}", reason=reason
        )
    )
    session.flush()
    return inc


# The cause of an incident about a job that does not start: its launcher gave up before
# any step (the rendezvous closed, the workers never came up). Nothing to act on.
LAUNCH_FAILED = "launch_failed"


def launch_failure(session: Session, job_name: str, reason: str, actor: str) -> Incident:
    """A launcher of `job_name` gave up without the job training, for `reason` (its last
    error line). The job reads `failed`, "the job does not start: ...", and one incident
    (failed, no action taken) says so; a later report of the same job updates it. The
    job is made when no rank of it ever reported (audited)."""
    now = time.time()
    job = get_or_create_job(session, job_name, now)
    text = f"the job does not start: {reason}"[:2000]
    set_job_state(job, "failed", now, text)
    inc = session.scalar(
        select(Incident)
        .where(Incident.job_id == job.id, Incident.cause == LAUNCH_FAILED)
        .order_by(Incident.id.desc())
    )
    if inc is None or (job.last_step is not None and inc.fault_step != job.last_step):
        inc = open_incident(
            session,
            job,
            now=now,
            trigger="auto",
            triggered_by=actor,
            cause=LAUNCH_FAILED,
            level="launcher",
            reason=text,
            fault_at=now,
            detected_at=now,
            fault_step=job.last_step,
        )
    add_decision(
        session, inc, {"at": now, "level": "launcher", "why": text, "by": actor, "mode": "observed"}
    )
    fail(session, inc, now, text)
    session.add(
        AuditLog(ts=now, actor=actor, action="launch_failed", target=f"job:{job_name}", reason=text)
    )
    session.flush()
    return inc


def _a(word: str) -> str:
    """The indefinite article before a level's name: an in_process, a launcher."""
    return "an" if word[:1] in "aeiou" else "a"


# The launcher's restart budget (--max-restarts, shared by faults and operator restarts):
# a launcher restart with this many left or fewer uses its last one, and the next worker
# failure ends the job. The engine holds there too (engine/decide.py).
LAST_LAUNCHER_RESTART = 1
RESTART_BUDGET = "restart_budget"  # the code of the 409 that a force overrides


def budget_text(budget: Mapping[str, int | None]) -> str:
    """The launcher's budget in words, for a refusal or a decision."""
    most, used, left = budget["max_restarts"], budget["restart_count"], budget["restarts_left"]
    head = f"the launcher allows {most} restarts (--max-restarts) and has used {used}"
    if left == 0:
        return f"{head}: none is left, a launcher restart ends the job (the launcher gives up)"
    if left == 1:
        return (
            f"{head}: a launcher restart would use the last one, "
            "and the next worker failure after it ends the job"
        )
    return f"{head}: {left} left"


def why_not(level: str, caps: dict[str, Any]) -> str:
    if level == "in_process":
        return "not every live rank runs under NVRx's inprocess.Wrapper (declared by the SDK)"
    return "no launcher (torchrun, ft_launcher) respawns its ranks"


# --- the end of an action: acks, resolution, failure ---------------------------------------


# A job given up on (stop_job), as its stop_job commands go (record_stop).
ENDING_LAUNCHER = "trainguard is ending its launcher"
STILL_RESTARTS = "trainguard stopped acting; the launcher still restarts it"


def record_phase(session: Session, cmd: Command, ack: wire.Ack) -> None:
    """A phase ack of one of the incident's commands (stored by commands.service) moves
    its timeline, and resolves or fails it."""
    if cmd.incident_id is None:
        return
    if cmd.action == "stop_job":
        record_stop(session, cmd, ack)
        return
    inc = session.get(Incident, cmd.incident_id, with_for_update=True, populate_existing=True)
    if inc is None:
        return
    if inc.acted_at is not None and cmd.issued_at < inc.acted_at:
        return  # an ack of an action that an escalation superseded: kept, not counted
    if inc.status != "open":
        return  # resolved, given up, rejected or already failed: the timeline is closed
    if ack.phase == "failed":
        if reads.NOTHING_HERE in ack.detail and _others_carry_on(session, inc, cmd):
            return  # its workers there were gone; the action goes on on the other nodes
        fail(session, inc, time.time(), f"failed on {ack.node}: {ack.detail}")
        return
    field = _PHASE_FIELD[ack.phase]
    if ack.phase != "delivered" and inc.decided_at is not None and ack.ts < inc.decided_at:
        # The job restarted by itself (NVRx's Wrapper, its launcher) before trainguard
        # decided: the command found the restart done. The timeline is the recovery's, so
        # the decision and the delivery, which did not bring it, leave it (they stay in
        # the decisions and the commands).
        inc.decided_at = inc.delivered_at = None
        if "restarted by itself" not in inc.outcome:
            inc.outcome = "the job restarted by itself before trainguard decided"
        changed(session, inc)
    current = getattr(inc, field)
    if (
        current is None
        or (ack.phase == "delivered" and ack.ts < current)
        or (ack.phase != "delivered" and ack.ts > current)
    ) and _fits(inc, field, ack.ts):
        setattr(inc, field, ack.ts)
        changed(session, inc)
    if ack.phase == "resumed":
        # Resolved once every node addressed by the current action has resumed (a node
        # whose workers were already gone, acked "no live rank", does not hold it up).
        session.flush()
        done = reads.terminal_acks(session, inc)
        if all(done.values()) and "resumed" in done.values():
            resolve(session, inc, time.time(), "resumed")


def record_stop(session: Session, cmd: Command, ack: wire.Ack) -> None:
    """An ack of stop_job's command: once every node answered, the stopped job's state
    says whether its launcher ended (torn_down; a node where nothing of it ran any more
    needs nothing) or goes on restarting it somewhere (failed)."""
    if ack.phase not in ("torn_down", "failed"):
        return
    session.flush()
    job = session.get(Job, cmd.job_id, with_for_update=True, populate_existing=True)
    if job is None or job.state != "stopped":
        return
    ends = session.execute(
        select(Node.name, CommandAck.phase, CommandAck.detail)
        .select_from(Command)
        .join(Node, Node.id == Command.node_id)
        .outerjoin(
            CommandAck,
            (CommandAck.command_id == Command.id) & CommandAck.phase.in_(("torn_down", "failed")),
        )
        .where(Command.incident_id == cmd.incident_id, Command.action == "stop_job")
        .order_by(Node.name)
    ).all()
    if any(phase is None for _, phase, _ in ends):
        return  # still under way somewhere
    failed = [
        f"{node}: {detail}"
        for node, phase, detail in ends
        if phase == "failed" and reads.NOTHING_HERE not in detail
    ]
    ended = [node for node, phase, _ in ends if phase == "torn_down"]
    if failed:
        reason = f"{cmd.reason}; {STILL_RESTARTS} ({'; '.join(failed)})"
    elif ended:
        reason = f"{cmd.reason}; trainguard ended its launcher on {', '.join(ended)}"
    else:
        reason = f"{cmd.reason}; nothing of it runs any more"
    set_job_state(job, "stopped", ack.ts, reason)


def resolve(
    session: Session,
    inc: Incident,
    now: float,
    outcome: str,
    *,
    resumed_at: float | None = None,
    resumed_step: int | None = None,
) -> None:
    """The job trains again. `resumed_at`: when, if no ack said so already;
    `resumed_step`: its first step since, for the progress lost when none was known."""
    if resumed_at is not None:
        inc.resumed_at = resumed_at
    inc.status = "resolved"
    inc.closed_at = now
    inc.not_before = None  # nothing is waited for any more
    inc.outcome = outcome[:2000]
    if resumed_step is not None and inc.lost_steps is None and inc.fault_step is not None:
        inc.lost_steps = max(0, inc.fault_step - resumed_step + 1)
    changed(session, inc)


def fail(
    session: Session, inc: Incident, now: float, outcome: str, *, end_wait: bool = False
) -> None:
    """The action failed (`end_wait`: and a wait for the launcher is over). The wait of a
    failed incident stays otherwise: it says the wait was had (sweep.failed_incidents)."""
    inc.status = "failed"
    inc.closed_at = now
    if end_wait:
        inc.not_before = None
    inc.outcome = outcome
    changed(session, inc)


def wait_for_relaunch(session: Session, inc: Incident, until: float, outcome: str) -> None:
    """A failure that only says the job's workers were gone: open again, waiting until
    `until` for the launcher's new generation."""
    inc.status = "open"
    inc.closed_at = None
    inc.not_before = inc.not_before or until
    inc.outcome = outcome[:2000]
    changed(session, inc)


def _others_carry_on(session: Session, inc: Incident, cmd: Command) -> bool:
    """Whether the current action's other commands are still under way or resumed (then
    a node whose workers were gone does not fail the incident)."""
    session.flush()
    done = reads.terminal_acks(session, inc)
    done.pop(cmd.id, None)
    if not done or "failed" in done.values():
        return False
    if "resumed" in done.values() and all(done.values()):
        resolve(session, inc, time.time(), "resumed")
    return any(v in (None, "resumed") for v in done.values())


def _fits(inc: Incident, field: str, ts: float) -> bool:
    """Whether `ts` keeps the timeline in order (fault <= detected <= ... <= resumed)
    with the timestamps already present. One that does not (a late ack of a phase the
    timeline has passed) stays on its command, out of the incident's timeline."""
    i = TIMELINE.index(field)
    before = [getattr(inc, f) for f in TIMELINE[:i]]
    after = [getattr(inc, f) for f in TIMELINE[i + 1 :]]
    return all(t is None or t <= ts for t in before) and all(t is None or ts <= t for t in after)
