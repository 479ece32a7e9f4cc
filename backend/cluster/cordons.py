"""Cordons: a node taken out of new work, with its reason, and its readmission.

Every cordon is a row of `node_cordons` (who or what cordoned the node, why, the incident
and its hardware evidence), closed by the readmission (who, why). `nodes.cordoned` is the
current state; the rows are the node's history. A node cordoned `repair_after` times
within `repair_window_s` is flagged for repair: only an operator readmits it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from trainguard.backend import audit
from trainguard.backend.models import Node, NodeCordon


def cordon(
    session: Session,
    node: Node,
    by: str,
    reason: str,
    now: float,
    incident_id: int | None = None,
    evidence: str = "",
) -> NodeCordon | None:
    """Cordon the node (audited); None when it already was."""
    if node.cordoned:
        return None
    node.cordoned = True
    row = NodeCordon(
        node_id=node.id,
        at=now,
        by=by,
        reason=reason[:2000],
        incident_id=incident_id,
        evidence=evidence[:2000],
    )
    session.add(row)
    audit.record(
        session, ts=now, actor=by, action="cordon", target=f"node:{node.name}", reason=reason[:2000]
    )
    return row


def readmit(session: Session, node: Node, by: str, reason: str, now: float) -> bool:
    """Uncordon the node (audited) and close its open cordon; False when it was not
    cordoned."""
    if not node.cordoned:
        return False
    node.cordoned = False
    for row in session.scalars(
        select(NodeCordon).where(NodeCordon.node_id == node.id, NodeCordon.released_at.is_(None))
    ):
        row.released_at = now
        row.released_by = by
        row.release_reason = reason[:2000]
    audit.record(
        session,
        ts=now,
        actor=by,
        action="uncordon",
        target=f"node:{node.name}",
        reason=reason[:2000],
    )
    return True


def cordon_dict(row: NodeCordon) -> dict[str, Any]:
    return {
        "id": row.id,
        "at": row.at,
        "by": row.by,
        "reason": row.reason,
        "incident_id": row.incident_id,
        "evidence": row.evidence,
        "released_at": row.released_at,
        "released_by": row.released_by,
        "release_reason": row.release_reason,
    }


def open_cordons(session: Session, node_ids: list[int] | None = None) -> dict[int, NodeCordon]:
    """The current (unreleased) cordon of each cordoned node."""
    stmt = select(NodeCordon).where(NodeCordon.released_at.is_(None))
    if node_ids is not None:
        stmt = stmt.where(NodeCordon.node_id.in_(node_ids))
    out: dict[int, NodeCordon] = {}
    for row in session.scalars(stmt.order_by(NodeCordon.at)):
        out[row.node_id] = row
    return out


def counts_since(
    session: Session, since: float, node_ids: list[int] | None = None
) -> dict[int, int]:
    """Cordons per node since `since`."""
    stmt = (
        select(NodeCordon.node_id, func.count())
        .where(NodeCordon.at >= since)
        .group_by(NodeCordon.node_id)
    )
    if node_ids is not None:
        stmt = stmt.where(NodeCordon.node_id.in_(node_ids))
    return {nid: int(n) for nid, n in session.execute(stmt).all()}


def history(session: Session, node: Node, limit: int = 100) -> list[dict[str, Any]]:
    rows = session.scalars(
        select(NodeCordon)
        .where(NodeCordon.node_id == node.id)
        .order_by(NodeCordon.at.desc())
        .limit(limit)
    )
    return [cordon_dict(r) for r in rows]
