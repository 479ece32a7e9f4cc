"""Durable commands and incidents: creation, delivery to agents, phase acks, timelines."""

from __future__ import annotations

import time
import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainguard.backend.engine.queries import capabilities
from trainguard.backend.errors import Conflict, NotFound
from trainguard.backend.jobs.service import live_ranks
from trainguard.backend.models import TIMELINE, AuditLog, Command, CommandAck, Incident, Job, Node
from trainguard.backend.models.control import IncidentEvidence
from trainguard.protocol import wire

# A failed ack that says the command found none of the job's workers on its node (the
# executor's words): they were gone, most likely because the launcher is restarting them.
NOTHING_HERE = "no live rank"

# Which incident field each ack phase fills: the first delivery, the last of the others
# (a phase is complete when every node has done it).
_PHASE_FIELD = {
    "delivered": "delivered_at",
    "torn_down": "torn_down_at",
    "restarted": "restarted_at",
    "resumed": "resumed_at",
}


def manual_restart(
    session: Session, job: Job, level: str, reason: str, actor: str, fresh_within_s: float
) -> Incident:
    ranks = live_ranks(session, job, fresh_within_s)
    if not ranks:
        raise Conflict(f"job {job.name!r} has no live ranks to restart")
    now = time.time()
    caps = capabilities(session, job.id, now - fresh_within_s)
    if level not in caps["levels"]:
        raise Conflict(
            f"job {job.name!r} cannot carry out a {level} restart: {why_not(level, caps)}"
        )
    incident = Incident(
        job_id=job.id,
        created_at=now,
        trigger="manual",
        triggered_by=actor,
        cause="operator",
        level=level,
        reason=reason,
        status="open",
        outcome="",
        fault_step=job.last_step,
        fault_at=now,
        detected_at=now,
        decided_at=now,
        acted_at=now,
        fault_attempt=job.attempt,
        fault_iteration=job.iteration,
        escalations=0,
        decisions=[
            {
                "at": now,
                "level": level,
                "why": reason,
                "by": actor,
                "mode": "manual",
                "restart": True,
            }
        ],
        hooks=[],
    )
    session.add(incident)
    session.flush()
    for node_id in sorted({r.node_id for r, _ in ranks}):
        session.add(
            Command(
                id=uuid.uuid4().hex,
                incident_id=incident.id,
                job_id=job.id,
                node_id=node_id,
                action=level,
                reason=reason,
                # wire.Command params are scalars: the ranks travel as "0,1".
                params={
                    "ranks": ",".join(
                        str(r.rank)
                        for r, _ in sorted(ranks, key=lambda x: x[0].rank)
                        if r.node_id == node_id
                    )
                },
                issued_at=now,
            )
        )
    session.add(
        AuditLog(
            ts=now, actor=actor, action=f"restart:{level}", target=f"job:{job.name}", reason=reason
        )
    )
    session.flush()
    return incident


def why_not(level: str, caps: dict[str, Any]) -> str:
    if level == "in_process":
        return "not every live rank runs under NVRx's inprocess.Wrapper (declared by the SDK)"
    return "no launcher (torchrun, ft_launcher) respawns its ranks"


def pending_for_node(session: Session, node: str) -> list[wire.Command]:
    rows = session.execute(
        select(Command, Job.name)
        .join(Node, Node.id == Command.node_id)
        .join(Job, Job.id == Command.job_id)
        .where(Node.name == node, Command.delivered_at.is_(None))
        .order_by(Command.issued_at)
    ).all()
    return [
        wire.Command(
            id=c.id,
            job=job_name,
            action=c.action,  # type: ignore[arg-type]  # the column holds an Action name
            node=node,
            issued_at=c.issued_at,
            incident_id=c.incident_id,
            reason=c.reason[:256],
            params=c.params,
        )
        for c, job_name in rows
    ]


def record_ack(session: Session, command_id: str, ack: wire.Ack) -> bool:
    """Store one phase ack; returns False if this phase was already acked (replay)."""
    cmd = session.get(Command, command_id)
    if cmd is None:
        raise NotFound(f"no command {command_id!r}")
    node = session.get(Node, cmd.node_id)
    if node is None or node.name != ack.node:
        raise Conflict(f"command {command_id!r} is not addressed to node {ack.node!r}")
    if session.get(CommandAck, (command_id, ack.phase)) is not None:
        return False
    now = time.time()
    session.add(
        CommandAck(
            command_id=command_id, phase=ack.phase, ts=ack.ts, received_at=now, detail=ack.detail
        )
    )
    if ack.phase == "delivered" and cmd.delivered_at is None:
        cmd.delivered_at = ack.ts
    if cmd.incident_id is not None:
        _advance_incident(session, cmd.incident_id, cmd, ack)
    session.flush()
    return True


def _advance_incident(session: Session, incident_id: int, cmd: Command, ack: wire.Ack) -> None:
    inc = session.get(Incident, incident_id, with_for_update=True, populate_existing=True)
    if inc is None:
        return
    if inc.acted_at is not None and cmd.issued_at < inc.acted_at:
        return  # an ack of an action that an escalation superseded: kept, not counted
    if inc.status != "open":
        return  # resolved, given up, rejected or already failed: the timeline is closed
    if ack.phase == "failed":
        if NOTHING_HERE in ack.detail and _others_carry_on(session, inc, cmd):
            return  # its workers there were gone; the action goes on on the other nodes
        inc.status = "failed"
        inc.closed_at = time.time()
        inc.outcome = f"failed on {ack.node}: {ack.detail}"
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
    current = getattr(inc, field)
    if (
        current is None
        or (ack.phase == "delivered" and ack.ts < current)
        or (ack.phase != "delivered" and ack.ts > current)
    ) and _fits(inc, field, ack.ts):
        setattr(inc, field, ack.ts)
    if ack.phase == "resumed":
        # Resolved once every node addressed by the current action has resumed (a node
        # whose workers were already gone, acked "no live rank", does not hold it up).
        session.flush()
        done = _terminal_acks(session, inc)
        if all(done.values()) and "resumed" in done.values():
            inc.status = "resolved"
            inc.outcome = "resumed"
            inc.closed_at = time.time()


def _terminal_acks(session: Session, inc: Incident) -> dict[str, str | None]:
    """{command id: "resumed" | "gone" (failed: no live rank there) | "failed" | None (still
    under way)} for the commands of the incident's current action."""
    stmt = select(Command.id).where(Command.incident_id == inc.id)
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


def _others_carry_on(session: Session, inc: Incident, cmd: Command) -> bool:
    """Whether the current action's other commands are still under way or resumed (then
    a node whose workers were gone does not fail the incident)."""
    session.flush()
    done = _terminal_acks(session, inc)
    done.pop(cmd.id, None)
    if not done or "failed" in done.values():
        return False
    if "resumed" in done.values() and all(done.values()):
        inc.status = "resolved"
        inc.outcome = "resumed"
        inc.closed_at = time.time()
    return any(v in (None, "resumed") for v in done.values())


def _fits(inc: Incident, field: str, ts: float) -> bool:
    """Whether `ts` keeps the timeline in order (fault <= detected <= ... <= resumed)
    with the timestamps already present. One that does not (a late ack of a phase the
    timeline has passed) stays on its command, out of the incident's timeline."""
    i = TIMELINE.index(field)
    before = [getattr(inc, f) for f in TIMELINE[:i]]
    after = [getattr(inc, f) for f in TIMELINE[i + 1 :]]
    return all(t is None or t <= ts for t in before) and all(t is None or ts <= t for t in after)


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
        "lost_steps": inc.lost_steps,
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


def get_incident(session: Session, incident_id: int) -> Incident:
    inc = session.get(Incident, incident_id)
    if inc is None:
        raise NotFound(f"no incident {incident_id}")
    return inc
