"""The reads the decision engine makes while deciding (each one indexed and small)."""

from __future__ import annotations

from typing import get_args

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from trainguard.backend.engine.evidence import SOFT_BUCKETS, as_int, hardware_evidence
from trainguard.backend.models import (
    Command,
    CommandAck,
    Event,
    Incident,
    Job,
    Node,
    NodeCordon,
    Rank,
)
from trainguard.backend.models.control import IncidentEvidence
from trainguard.protocol.wire import Phase
from trainguard.protocol.xid import describe_xid


def jobs_on_node(session: Session, node_id: int, since: float, pid: int | None = None) -> list[Job]:
    """Jobs with ranks alive on the node, reported since `since` (backend clock). When the
    evidence names a process that is one of those ranks, only that rank's job."""
    rows = session.execute(
        select(Rank.job_id, Rank.pid).where(
            Rank.node_id == node_id, Rank.alive.is_(True), Rank.updated_at >= since
        )
    ).all()
    ids = {job_id for job_id, _ in rows}
    if pid is not None:
        mine = {job_id for job_id, p in rows if p == pid}
        ids = mine or ids
    if not ids:
        return []
    return list(session.scalars(select(Job).where(Job.id.in_(ids)).order_by(Job.id)))


def job_nodes(
    session: Session, job_id: int, since: float, exclude: set[int] | frozenset[int] = frozenset()
) -> dict[int, list[int]]:
    """The nodes hosting the job's ranks (alive or just exited: the launcher that respawns
    them runs there), reported since `since`, the excluded nodes left out: {node_id:
    [ranks]}. A cordoned node is still one of them: cordon means no new work, and the
    ranks still running there are live ranks of their job."""
    rows = session.execute(
        select(Rank.node_id, Rank.rank)
        .where(Rank.job_id == job_id, Rank.updated_at >= since)
        .order_by(Rank.rank)
    ).all()
    out: dict[int, list[int]] = {}
    for node_id, rank in rows:
        if node_id not in exclude:
            out.setdefault(node_id, []).append(rank)
    return out


def live_elsewhere(
    session: Session, job_id: int, exclude: set[int] | frozenset[int]
) -> dict[int, list[int]]:
    """Nodes but `exclude`, not cordoned, where the job has ranks that were alive when
    last heard, however long ago, with those ranks: a node whose agent is silent
    (stopped, restarting) while its ranks train on (silence.py: not node down) still
    hosts the job."""
    rows = session.execute(
        select(Rank.node_id, Rank.rank)
        .join(Node, Node.id == Rank.node_id)
        .where(
            Rank.job_id == job_id,
            Rank.alive.is_(True),
            Rank.node_id.not_in(exclude),
            Node.cordoned.is_(False),
        )
        .order_by(Rank.rank)
    ).all()
    out: dict[int, list[int]] = {}
    for node_id, rank in rows:
        out.setdefault(node_id, []).append(rank)
    return out


def hard_xids_on_node(session: Session, node_id: int, since: float, until: float) -> int:
    """Hard XIDs (and lost GPUs) reported by one node in a time window."""
    rows = session.execute(
        select(Event.kind, Event.xid).where(
            Event.node_id == node_id,
            Event.kind.in_(("xid", "gpu_lost")),
            Event.ts >= since,
            Event.ts <= until,
        )
    ).all()
    return sum(
        1
        for kind, xid in rows
        if kind == "gpu_lost" or (xid is not None and describe_xid(xid).action not in SOFT_BUCKETS)
    )


def last_checkpoint_step(
    session: Session, job: str, before: float, fault_step: int | None, lookback_s: float = 7 * 86400
) -> int | None:
    """The step of the job's last completed checkpoint save before the fault."""
    rows = session.execute(
        select(Event.data)
        .where(
            Event.kind == "checkpoint",
            Event.ts <= before,
            Event.ts >= before - lookback_s,
            Event.job == job,
        )
        .order_by(Event.ts.desc())
        .limit(200)
    ).scalars()
    for data in rows:
        if not isinstance(data, dict) or data.get("phase") not in ("save_end", "save"):
            continue
        if data.get("ok") is False:
            continue
        step = as_int(data.get("step"))
        if step is not None and (fault_step is None or step <= fault_step):
            return step
    return None


def actions_since(
    session: Session, job_id: int, since: float, level: str | None, node: str | None = None
) -> int:
    """Automatic (or approved) restart actions taken on a job since `since` (all levels,
    or one; `node`: only those about that node, as an exclusion names it)."""
    rows = session.scalars(
        select(Incident.decisions).where(Incident.job_id == job_id, Incident.acted_at >= since)
    ).all()
    return sum(
        1
        for decisions in rows
        for d in decisions or ()
        if d.get("restart")
        and d.get("mode") != "manual"  # the ladder and the budget govern automatic actions
        and d.get("at", 0) >= since
        and (level is None or d.get("level") == level)
        and (node is None or d.get("node") == node)
    )


def last_action_at(session: Session, job_id: int) -> float | None:
    return session.scalar(select(func.max(Incident.acted_at)).where(Incident.job_id == job_id))


def current_commands(session: Session, inc: Incident) -> list[Command]:
    """The commands of the incident's current action (issued at or after acted_at)."""
    stmt = select(Command).where(Command.incident_id == inc.id)
    if inc.acted_at is not None:
        stmt = stmt.where(Command.issued_at >= inc.acted_at)
    return list(session.scalars(stmt))


def failed_acks(session: Session, inc: Incident) -> list[tuple[int, str]]:
    """(node_id, detail) of the current action's commands acked `failed`."""
    stmt = (
        select(Command.node_id, CommandAck.detail)
        .join(CommandAck, CommandAck.command_id == Command.id)
        .where(Command.incident_id == inc.id, CommandAck.phase == "failed")
    )
    if inc.acted_at is not None:
        stmt = stmt.where(Command.issued_at >= inc.acted_at)
    return [(n, d) for n, d in session.execute(stmt).all()]


def hardware_nodes(session: Session, inc: Incident) -> list[tuple[int, str]]:
    """(node_id, detail) of the incident's evidence about a node's hardware or
    reachability, newest first: what may exclude a node."""
    rows = session.execute(
        select(
            IncidentEvidence.node_id,
            IncidentEvidence.kind,
            IncidentEvidence.xid,
            IncidentEvidence.action,
            IncidentEvidence.cause,
            IncidentEvidence.detail,
        )
        .where(IncidentEvidence.incident_id == inc.id, IncidentEvidence.node_id.is_not(None))
        .order_by(IncidentEvidence.ts.desc(), IncidentEvidence.id.desc())
    ).all()
    return [
        (node_id, detail if detail.startswith(cause) else f"{cause}: {detail}")
        for node_id, kind, xid, action, cause, detail in rows
        # node_id is never None here (the query filters it out); this narrows the type.
        if node_id is not None and hardware_evidence(kind, xid, action)
    ]


def culprit_node(session: Session, inc: Incident) -> int | None:
    """The node to exclude: the node of the incident's newest hardware evidence (a hard
    XID, a lost GPU, a silent agent). None without such evidence: a failed restart, an
    exception or a hang says nothing against a node (do no harm)."""
    found = hardware_nodes(session, inc)
    return found[0][0] if found else None


def engine_cordons_since(session: Session, since: float) -> int:
    """Automatic cordons (the breaker's count) since `since`."""
    return int(
        session.scalar(
            select(func.count())
            .select_from(NodeCordon)
            .where(NodeCordon.by == "engine", NodeCordon.at >= since)
        )
        or 0
    )


def cluster_size(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(Node)) or 0)


ACK_ORDER = get_args(Phase)  # the wire's phases, in the order a command goes through them


def last_ack(session: Session, inc: Incident) -> tuple[str, str, float] | None:
    """(node, phase, ts) of the furthest ack of the current action's commands (by phase,
    then time: an agent may ack two phases within one clock tick)."""
    stmt = (
        select(Node.name, CommandAck.phase, CommandAck.ts)
        .join(Command, CommandAck.command_id == Command.id)
        .join(Node, Node.id == Command.node_id)
        .where(Command.incident_id == inc.id)
    )
    if inc.acted_at is not None:
        stmt = stmt.where(Command.issued_at >= inc.acted_at)
    rows = [(n, p, t) for n, p, t in session.execute(stmt).all()]
    return max(rows, key=lambda r: (ACK_ORDER.index(r[1]), r[2]), default=None)


def any_rank_alive(session: Session, job_id: int) -> bool:
    """Whether a rank of the job is alive as its agent last listed it."""
    stmt = select(Rank.rank).where(Rank.job_id == job_id, Rank.alive.is_(True)).limit(1)
    return session.execute(stmt).first() is not None
