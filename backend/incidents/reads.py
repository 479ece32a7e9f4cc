"""Reads of incidents: one as the API answers it (GET /api/v1/incidents/{id}, the list,
the live bus: its row, timeline, evidence and the commands of its actions with their
acks), and how far the commands of its current action got."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from trainguard.backend.analytics.service import lost_steps
from trainguard.backend.errors import NotFound
from trainguard.backend.models import TIMELINE, Command, CommandAck, Event, Incident, Job, Node
from trainguard.backend.models.control import IncidentEvidence

# A failed ack that says the command found none of the job's workers on its node (the
# executor's words): they were gone, most likely because the launcher is restarting them.
NOTHING_HERE = "no live rank"


def incident_dict(session: Session, inc: Incident) -> dict[str, Any]:
    job = session.get(Job, inc.job_id)
    cmds = session.execute(
        select(Command, Node.name)
        .join(Node, Node.id == Command.node_id)
        .where(Command.incident_id == inc.id)
        .order_by(Command.issued_at)
    ).all()
    acks = session.scalars(
        select(CommandAck)
        .where(CommandAck.command_id.in_([c.id for c, _ in cmds]))
        .order_by(CommandAck.ts)
    ).all()
    evidence = session.execute(
        select(IncidentEvidence, Node.name)
        .outerjoin(Node, Node.id == IncidentEvidence.node_id)
        .where(IncidentEvidence.incident_id == inc.id)
        .order_by(IncidentEvidence.ts, IncidentEvidence.id)
        .limit(200)
    ).all()
    fault_node = session.get(Node, inc.node_id) if inc.node_id is not None else None
    timeline = {f: getattr(inc, f) for f in TIMELINE}
    recovery = (
        inc.resumed_at - inc.fault_at
        if inc.resumed_at is not None and inc.fault_at is not None
        else None
    )
    return {
        "id": inc.id,
        "incident_id": inc.id,
        "job": job.name if job else None,
        "job_state": job.state if job else None,
        "created_at": inc.created_at,
        "trigger": inc.trigger,
        "triggered_by": inc.triggered_by,
        "cause": inc.cause,
        "level": inc.level,
        "reason": inc.reason,
        "status": inc.status,
        "outcome": inc.outcome,
        "fault_step": inc.fault_step,
        "lost_steps": lost_steps(session, inc),  # the estimate until the job restarted
        "node": fault_node.name if fault_node is not None else None,
        "gpu_uuid": inc.gpu_uuid,
        "xid": inc.xid,
        "escalations": inc.escalations,
        "not_before": inc.not_before,
        "acted_at": inc.acted_at,
        "closed_at": inc.closed_at,
        "timeline": timeline,
        "recovery_s": recovery,
        "decisions": list(inc.decisions or ()),
        "shadow": shadow_decisions(session, inc, [e.event_id for e, _ in evidence]),
        "hooks": list(inc.hooks or ()),
        "evidence": [
            {
                "kind": e.kind,
                "cause": e.cause,
                "action": e.action,
                "node": name,
                "rank": e.rank,
                "xid": e.xid,
                "ts": e.ts,
                "received_at": e.received_at,
                "event_id": e.event_id,
                "detail": e.detail,
            }
            for e, name in evidence
        ],
        "commands": [
            {
                "id": c.id,
                "node": name,
                "action": c.action,
                "issued_at": c.issued_at,
                "delivered_at": c.delivered_at,
                "acks": [
                    {"phase": a.phase, "ts": a.ts, "detail": a.detail}
                    for a in acks
                    if a.command_id == c.id
                ],
            }
            for c, name in cmds
        ],
    }


def shadow_decisions(
    session: Session, inc: Incident, event_ids: Sequence[int | None]
) -> list[dict[str, Any]]:
    """What the policy's shadow rules would have done on the incident's evidence (the
    engine's `shadow` events, docs/engine.md "Shadow rules"), oldest first."""
    ids = {i for i in event_ids if i is not None}
    if not ids:
        return []
    stmt = select(Event.ts, Event.data).where(
        Event.kind == "shadow", Event.ts >= inc.created_at - 1
    )
    if inc.closed_at is not None:
        stmt = stmt.where(Event.ts <= inc.closed_at + 1)
    out = []
    for ts, data in session.execute(stmt.order_by(Event.ts, Event.id)):
        d = data or {}
        if d.get("event_id") in ids:
            keys = ("rule", "action", "instead_of", "cause")
            out.append({"at": ts, **{k: d.get(k) for k in keys}})
    return out


def locked(session: Session, *where: ColumnElement[bool]) -> Sequence[Incident]:
    """The incidents matching `where`, locked for this transaction (FOR UPDATE) and read
    afresh: the engine's sweeps change them, one leader at a time."""
    return session.scalars(
        select(Incident).where(*where).with_for_update().execution_options(populate_existing=True)
    ).all()


def locked_with_jobs(session: Session, *where: ColumnElement[bool]) -> list[tuple[Incident, Job]]:
    """`locked`, each with its job (an incident whose job is gone is left out)."""
    out = []
    for inc in locked(session, *where):
        job = session.get(Job, inc.job_id)
        if job is not None:
            out.append((inc, job))
    return out


def terminal_acks(session: Session, inc: Incident) -> dict[str, str | None]:
    """{command id: "resumed" | "gone" (failed: no live rank there) | "failed" | None (still
    under way)} for the commands of the incident's current action."""
    # The excluded node's leaving (exclude_node) is no restart: it ends at torn_down.
    stmt = select(Command.id).where(Command.incident_id == inc.id, Command.action != "exclude_node")
    if inc.acted_at is not None:
        stmt = stmt.where(Command.issued_at >= inc.acted_at)
    out: dict[str, str | None] = dict.fromkeys(session.scalars(stmt).all())
    for cid, phase, detail in session.execute(
        select(CommandAck.command_id, CommandAck.phase, CommandAck.detail).where(
            CommandAck.command_id.in_(list(out)), CommandAck.phase.in_(("resumed", "failed"))
        )
    ):
        if phase == "resumed":
            out[cid] = "resumed"
        elif out[cid] is None:
            out[cid] = "gone" if NOTHING_HERE in detail else "failed"
    return out


def joined_since(session: Session, job: str, since: float) -> set[str]:
    """The nodes where ranks of the job started since `since` (their rank_start events,
    which agents send at once, before the ranks' first step)."""
    stmt = (
        select(Node.name)
        .join(Event, Event.node_id == Node.id)
        .where(Event.kind == "rank_start", Event.job == job, Event.ts >= since)
        .distinct()
    )
    return set(session.scalars(stmt).all())


def get_incident(session: Session, incident_id: int) -> Incident:
    inc = session.get(Incident, incident_id)
    if inc is None:
        raise NotFound(f"no incident {incident_id}")
    return inc
