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

import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from sqlalchemy.orm import Session

from trainguard.backend.incidents.publish import changed
from trainguard.backend.models import Command, Incident, Job, Node
from trainguard.backend.models.control import IncidentEvidence

# --- opening, evidence ----------------------------------------------------------------


class Fact(Protocol):
    """What an incident keeps of a piece of evidence (the engine's Evidence has it)."""

    kind: str
    ts: float
    received_at: float
    node_id: int | None
    rank: int | None
    xid: int | None


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
    ev: Fact,
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
    extra: Mapping[str, Any] | None = None,
) -> int:
    """The one place Command rows are made: one per node of `targets` ({node id: the
    job's ranks there}), durable, so an agent gets its command when it next polls, after
    any reconnect. With `fault`, each also carries the fault's generation (cause,
    fault_at, attempt, iteration): the agent acks a restart that happened since as served
    (an automatic action can come after the job restarted by itself). A manual restart
    has no earlier fault: it restarts what runs now. Returns how many were made."""
    for node_id, ranks in sorted(targets.items()):
        # wire.Command params are scalars: the ranks travel as "0,1".
        params: dict[str, Any] = {"ranks": ",".join(map(str, sorted(ranks))), **(extra or {})}
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


def leave_job(
    session: Session,
    inc: Incident,
    job: Job,
    node: Node,
    hosts: Mapping[int, list[int]],
    now: float,
    grace_s: float,
    entry: dict[str, Any],
) -> int:
    """The excluded `node` leaves `job`: an exclude_node command to its agent ends the
    job's launcher there, so its workers cannot rejoin the next round (acks:
    incidents.acks.record_leave). `hosts` are the job's live nodes with their ranks. A
    node hosting no rank of the job has nothing to end; the job's only node keeps its
    launcher: ending it would end the job for good, since trainguard starts no launcher
    (docs/decisions.md). The decision `entry` says which. Returns the commands made."""
    if node.id not in hosts:
        entry["leave"] = f"{node.name} hosts no rank of job {job.name}: nothing ends there"
        return 0
    if set(hosts) == {node.id}:
        entry["leave"] = f"{node.name} is the only node of job {job.name}: its launcher stays"
        return 0
    entry["leave"] = f"{node.name} leaves job {job.name}: its launcher is ended"
    reason = f"incident {inc.id}: {node.name} leaves job {job.name}"
    return issue_commands(
        session,
        inc,
        "exclude_node",
        {node.id: hosts[node.id]},
        now,
        reason,
        fault=False,
        extra={"grace_s": grace_s},
    )


# --- the end of an action: acks, resolution, failure ---------------------------------------


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
