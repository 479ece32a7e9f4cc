"""Durable commands on the agents' channel: delivery to a node's agent, phase acks.

Commands are made by the incidents they carry out (incidents.service.issue_commands);
an ack is stored here and moves its incident through incidents.service.record_phase.
"""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainguard.backend.errors import Conflict, NotFound
from trainguard.backend.incidents import service as incidents
from trainguard.backend.models import Command, CommandAck, Job, Node
from trainguard.protocol import wire


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
    incidents.record_phase(session, cmd, ack)
    session.flush()
    return True
