"""The job's shape: which nodes train it, which wait as hot spares, which were excluded,
and its `--nnodes` MIN:MAX (docs/engine.md, "The job's shape").

- active: a node with live ranks of the job (reported within the freshness window), or
  whose agent reports an active or restarting launcher of it;
- spare: a node whose agent reports a launcher of the job that started no worker (it
  waits in the rendezvous beyond --nnodes MAX) and that is not active. It counts as spare
  capacity only while its agent reports (the node is neither down nor going away) and
  the node is not cordoned: a spare that cannot join is no capacity;
- excluded: a node cordoned by an incident of this job and not readmitted.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, exists, func, select
from sqlalchemy.orm import Session, aliased

from trainguard.backend.models import Incident, Job, Node, NodeCordon, NodeLauncher, Rank


def _unavailable(node: Node, since: float) -> str | None:
    """Why a spare on `node` cannot join the job now (None: it can)."""
    if node.last_seen < since:
        return "agent down: no report since the freshness window"
    if node.going_away:
        return f"agent going away: {node.going_away}"[:500]
    if node.cordoned:
        return "node cordoned"
    return None


def shape(session: Session, job: Job, since: float) -> dict[str, Any]:
    """The job's shape as `GET /jobs/{job}` answers it; `since`: the freshness cutoff
    (now minus node_down_after_s)."""
    active: set[str] = set(
        session.scalars(
            select(Node.name)
            .join(Rank, Rank.node_id == Node.id)
            .where(Rank.job_id == job.id, Rank.alive.is_(True), Rank.updated_at >= since)
        ).all()
    )
    rows = session.execute(
        select(NodeLauncher, Node)
        .join(Node, Node.id == NodeLauncher.node_id)
        .where(NodeLauncher.job_id == job.id)
        .order_by(Node.name, NodeLauncher.pid)
    ).all()
    for lc, node in rows:
        if lc.state in ("active", "restarting") and node.last_seen >= since:
            active.add(node.name)
    spares: dict[str, dict[str, Any]] = {}
    for lc, node in rows:
        if lc.state != "spare" or node.name in active or node.name in spares:
            continue
        why = _unavailable(node, since)
        spares[node.name] = {
            "node": node.name,
            "pid": lc.pid,
            "launcher": lc.launcher,
            "started_at": lc.started_at,
            "reported_at": lc.reported_at,
            "available": why is None,
            "why": why,
        }
    excluded = [
        {"node": name, "incident_id": inc_id, "at": at, "reason": reason}
        for name, inc_id, at, reason in session.execute(
            select(Node.name, NodeCordon.incident_id, NodeCordon.at, NodeCordon.reason)
            .join(Node, Node.id == NodeCordon.node_id)
            .join(Incident, Incident.id == NodeCordon.incident_id)
            .where(Incident.job_id == job.id, NodeCordon.released_at.is_(None))
            .order_by(NodeCordon.at)
        ).all()
    ]
    # --nnodes: the launchers of one job are started alike; the active ones' first.
    ordered = sorted(rows, key=lambda r: (r[0].state != "active", -r[0].reported_at))
    span = next(((lc.min_nodes, lc.max_nodes) for lc, _ in ordered if lc.max_nodes), None)
    return {
        "active": sorted(active),
        "spares": list(spares.values()),
        "spare_capacity": sum(1 for s in spares.values() if s["available"]),
        "excluded": excluded,
        "min_nodes": span[0] if span else None,
        "max_nodes": span[1] if span else None,
        "elastic": bool(span and span[0] != span[1]),
        "reported": bool(rows),
    }


def spare_capacity(session: Session, since: float) -> dict[int, int]:
    """Per job id: its spares that could join now (as `shape`'s `spare_capacity`), for
    the job list; jobs without any are left out."""
    live_here = exists().where(
        Rank.job_id == NodeLauncher.job_id,
        Rank.node_id == NodeLauncher.node_id,
        Rank.alive.is_(True),
        Rank.updated_at >= since,
    )
    other = aliased(NodeLauncher)
    active_here = exists().where(
        other.job_id == NodeLauncher.job_id,
        other.node_id == NodeLauncher.node_id,
        other.state.in_(("active", "restarting")),
    )
    rows = session.execute(
        select(NodeLauncher.job_id, func.count(func.distinct(NodeLauncher.node_id)))
        .join(Node, Node.id == NodeLauncher.node_id)
        .where(
            and_(
                NodeLauncher.state == "spare",
                Node.last_seen >= since,
                Node.going_away.is_(None),
                Node.cordoned.is_(False),
                ~live_here,
                ~active_here,
            )
        )
        .group_by(NodeLauncher.job_id)
    ).all()
    return {job_id: count for job_id, count in rows}
