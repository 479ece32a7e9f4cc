"""Durable commands on the agents' channel: what a node's agent has to do.

Commands are made by the incidents they carry out (incidents.service.issue_commands);
their acks are stored and move their incident in incidents/acks.py.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainguard.backend.models import Command, Job, Node
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
