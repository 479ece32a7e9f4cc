"""Reads of the cluster: node health, GPUs, downsampled sample series, events."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Float, Integer, cast, func, select
from sqlalchemy.orm import Session

from trainguard.backend.cluster import cordons
from trainguard.backend.errors import NotFound
from trainguard.backend.models import (
    SAMPLE_BUCKET_S,
    SAMPLE_READINGS,
    Event,
    Gpu,
    Node,
    Sample,
    in_sample_window,
    no_reading,
)
from trainguard.backend.retention import rollup_rows

XID_DEGRADES_FOR_S = 600.0
_ROLLUP_MEANS = (
    "util",
    "mem_util",
    "mem_used_mib",
    "temp_c",
    "power_w",
    "sm_clock_mhz",
    "mem_clock_mhz",
)
_ROLLUP_MAXES = ("ecc_sbe_volatile", "ecc_dbe_volatile", "remapped_uncorrectable", "pcie_replay")
_FLAGS = {"remap_pending", "remap_failure"}
_COUNTERS = {
    "clock_event_reasons",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "remapped_correctable",
    "remapped_uncorrectable",
    "pcie_replay",
    "energy_mj",
}


def node_status(node: Any, now: float, down_after_s: float) -> str:
    if node.cordoned:
        return "cordoned"
    age = now - node.last_seen
    if age > down_after_s:
        # The agent said goodbye (an upgrade, systemctl stop): it is gone, not the node.
        return "agent_down" if node.going_away else "down"
    if age > down_after_s / 3 or node.gpus_lost:
        return "degraded"
    if node.last_xid_at is not None and now - node.last_xid_at < XID_DEGRADES_FOR_S:
        return "degraded"
    return "healthy"


def node_dict(node: Any, gpu_count: int, now: float, down_after_s: float) -> dict[str, Any]:
    """`node` is a Node or a row of the nodes table (same attribute names)."""
    return {
        "name": node.name,
        "status": node_status(node, now, down_after_s),
        "simulated": node.simulated,
        "cordoned": node.cordoned,
        "first_seen": node.first_seen,
        "last_seen": node.last_seen,
        "gpu_count": gpu_count,
        "gpus_lost": node.gpus_lost,
        "clock_offset_s": node.clock_offset_s,
        "util_avg": node.util_avg,
        "temp_max": node.temp_max,
        "last_xid_at": node.last_xid_at,
        "going_away": node.going_away,
        "cordon": None,
        "cordons_recent": 0,
        "repair": False,
    }


def list_nodes(
    session: Session, down_after_s: float, repair: tuple[int, float] = (3, 7 * 86400.0)
) -> list[dict[str, Any]]:
    counts = dict(session.execute(select(Gpu.node_id, func.count()).group_by(Gpu.node_id)).all())
    now = time.time()
    # Plain rows (no ORM identity map): this is the overview's read at 2,048+ nodes.
    nodes = session.execute(select(*Node.__table__.c).order_by(Node.name)).all()
    info = cordon_info(session, None, repair, now)
    out = []
    for n in nodes:
        d = node_dict(n, counts.get(n.id, 0), now, down_after_s)
        d.update(info.get(n.id, {}))
        out.append(d)
    return out


def gpu_lost(latest: Any) -> bool:
    """A GPU is lost when its latest sample has no reading at all."""
    return latest is not None and no_reading(latest)


def cordon_info(
    session: Session,
    node_ids: list[int] | None,
    repair: tuple[int, float],
    now: float | None = None,
) -> dict[int, dict[str, Any]]:
    """Per node: its current cordon (who, why, incident, evidence), its cordons within the
    repair window and whether that flags it for repair. Nodes never cordoned are left out
    (the defaults are in node_dict)."""
    repair_after, window = repair
    now = time.time() if now is None else now
    current = cordons.open_cordons(session, node_ids)
    recent = cordons.counts_since(session, now - window, node_ids)
    out: dict[int, dict[str, Any]] = {}
    for nid in set(current) | set(recent):
        row = current.get(nid)
        out[nid] = {
            "cordon": cordons.cordon_dict(row) if row is not None else None,
            "cordons_recent": recent.get(nid, 0),
            "repair": recent.get(nid, 0) >= repair_after,
        }
    return out


def get_node(session: Session, name: str) -> Node:
    node = session.scalar(select(Node).where(Node.name == name))
    if node is None:
        raise NotFound(f"no node named {name!r}")
    return node


def node_gpus(session: Session, node: Node) -> list[dict[str, Any]]:
    gpus = session.scalars(select(Gpu).where(Gpu.node_id == node.id).order_by(Gpu.index)).all()
    latest_of = _latest_samples(session, node, [g.id for g in gpus])
    out = []
    for g in gpus:
        latest = latest_of.get(g.id)
        out.append(
            {
                "uuid": g.uuid,
                "index": g.index,
                "name": g.name,
                "pci_bus_id": g.pci_bus_id,
                "simulated": g.simulated,
                "memory_total_mib": g.memory_total_mib,
                "power_limit_w": g.power_limit_w,
                "lost": gpu_lost(latest),
                "latest": None
                if latest is None
                else {"ts": latest.ts, **{f: getattr(latest, f) for f in SAMPLE_READINGS}},
            }
        )
    return out


def raw_extent(session: Session) -> tuple[float, float] | None:
    """The times the raw samples span, to their buckets' edges (the index's two ends)."""
    # One aggregate a subquery: SQLite reads min() or max() off the index only alone.
    first, last = session.execute(
        select(
            select(func.min(Sample.bucket)).scalar_subquery(),
            select(func.max(Sample.bucket)).scalar_subquery(),
        )
    ).one()
    if first is None:
        return None
    return first * SAMPLE_BUCKET_S, (last + 1) * SAMPLE_BUCKET_S


def _latest_samples(session: Session, node: Node, gpu_ids: list[int]) -> dict[int, Sample]:
    """Each GPU's newest raw sample: looked for around the node's last batch first (on
    the agent's clock, which stamps samples), where a reporting GPU's is, then over every
    raw sample for the GPUs silent then."""
    out: dict[int, Sample] = {}

    def look(since: float, until: float) -> None:
        for gid in gpu_ids:
            if gid not in out:
                latest = session.scalar(
                    select(Sample)
                    .where(Sample.gpu_id == gid, in_sample_window(since, until))
                    .order_by(Sample.ts.desc())
                    .limit(1)
                )
                if latest is not None:
                    out[gid] = latest

    agent_now = node.last_seen + (node.clock_offset_s or 0.0)
    look(agent_now - 64.0, agent_now + 64.0)
    if len(out) < len(gpu_ids) and (extent := raw_extent(session)) is not None:
        look(*extent)
    return out


def gpu_series(
    session: Session, uuid: str, since: float, until: float, points: int
) -> dict[str, Any]:
    gpu = session.scalar(select(Gpu).where(Gpu.uuid == uuid))
    if gpu is None:
        raise NotFound(f"no GPU with uuid {uuid!r}")
    width = max((until - since) / points, 1e-6)
    bucket = cast(func.floor((Sample.ts - since) / width), Integer).label("b")
    cols = [bucket, func.avg(Sample.ts)]
    for f in SAMPLE_READINGS:
        col = getattr(Sample, f)
        if f in _FLAGS:
            cols.append(func.max(cast(col, Integer)))
        elif f in _COUNTERS:
            cols.append(func.max(col))
        else:
            cols.append(func.avg(cast(col, Float)))
    names = ["ts", *SAMPLE_READINGS]
    # The raw samples' part of the window, cut to what the table holds (a chart of weeks
    # names the buckets of hours).
    extent = raw_extent(session)
    buckets: dict[int, list[Any]] = {}
    if extent is not None and max(since, extent[0]) <= min(until, extent[1]):
        window = in_sample_window(max(since, extent[0]), min(until, extent[1]))
        buckets = {
            row[0]: list(row[1:])
            for row in session.execute(
                select(*cols).where(Sample.gpu_id == gpu.id, window).group_by(bucket)
            ).all()
        }
    # Older than the raw window: the rollups (backend/retention.py) fill the buckets.
    for b, vals in _rollup_buckets(session, gpu.id, since, until, width).items():
        buckets.setdefault(b, vals)
    columns: dict[str, list[Any]] = {n: [] for n in names}
    prev: int | None = None
    for b in sorted(buckets):
        if prev is not None and b - prev > 1:
            # A gap in the data: one row of nulls so the chart breaks the line.
            columns["ts"].append(since + (prev + 1) * width)
            for n in SAMPLE_READINGS:
                columns[n].append(None)
        prev = b
        for n, v in zip(names, buckets[b], strict=True):
            if n in _FLAGS and v is not None:
                v = bool(v)
            columns[n].append(v)
    return {
        "uuid": uuid,
        "simulated": gpu.simulated,
        "since": since,
        "until": until,
        "points": points,
        "columns": columns,
    }


def _rollup_buckets(
    session: Session, gpu_id: int, since: float, until: float, width: float
) -> dict[int, list[Any]]:
    """Rollup rows folded into the chart's buckets: means weighted by sample count, max of
    counters; readings a rollup does not keep are None."""
    acc: dict[int, dict[str, Any]] = {}
    for r in rollup_rows(session.connection(), gpu_id, since, until):
        b = int((r["ts"] - since) // width)
        a = acc.setdefault(b, {"n": 0, "sums": {}, "weights": {}, "max": {}})
        n = r["n"]
        a["n"] += n
        for f in ("ts", *_ROLLUP_MEANS):
            if r[f] is not None:
                a["sums"][f] = a["sums"].get(f, 0.0) + r[f] * n
                a["weights"][f] = a["weights"].get(f, 0) + n
        for f in _ROLLUP_MAXES:
            if r[f] is not None:
                a["max"][f] = max(a["max"].get(f, r[f]), r[f])
    out: dict[int, list[Any]] = {}
    for b, a in acc.items():
        vals: dict[str, Any] = {f: a["sums"][f] / a["weights"][f] for f in a["sums"]}
        vals.update(a["max"])
        out[b] = [vals.get("ts"), *(vals.get(f) for f in SAMPLE_READINGS)]
    return out


def event_dict(e: Event, node_name: str | None) -> dict[str, Any]:
    return {
        "id": e.id,
        "ts": e.ts,
        "received_at": e.received_at,
        "node": node_name,
        "kind": e.kind,
        "gpu_uuid": e.gpu_uuid,
        "job": e.job,
        "rank": e.rank,
        "xid": e.xid,
        "message": e.message,
        "data": e.data,
    }


def list_events(
    session: Session,
    node: str | None,
    kind: str | None,
    job: str | None,
    since: float | None,
    until: float | None,
    limit: int,
) -> list[dict[str, Any]]:
    stmt = select(Event, Node.name).outerjoin(Node, Node.id == Event.node_id)
    if node is not None:
        stmt = stmt.where(Node.name == node)
    if kind is not None:
        stmt = stmt.where(Event.kind == kind)
    if job is not None:
        stmt = stmt.where(Event.job == job)
    if since is not None:
        stmt = stmt.where(Event.ts >= since)
    if until is not None:
        stmt = stmt.where(Event.ts <= until)
    stmt = stmt.order_by(Event.ts.desc(), Event.id.desc()).limit(limit)
    return [event_dict(e, name) for e, name in session.execute(stmt).all()]
