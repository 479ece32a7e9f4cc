"""GPU readings in a trace, as spans (docs/replay.md, "What is replayed"): the engine
reads samples for one thing only, a cordoned node's automatic readmission ("every GPU
of the node reports readings, none lost", lifecycle._healthy). A trace keeps, per GPU,
the runs of its samples that had readings (`lost: false`) or had none (`lost: true`,
the GPU fallen off the bus), not every sample; the replay writes samples back from the
spans, every SAMPLE_EVERY_S, for the GPUs of the nodes cordoned in it (the only ones
read)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from trainguard.backend.models import Gpu, Node, Sample, in_sample_window

# Two samples of one GPU further apart than this are two spans (the agent was away).
SPAN_GAP_S = 10.0
# The replay writes a span back as one sample this often (the freshness the engine asks
# of a GPU is node_down_after_s, 15 s by default).
SAMPLE_EVERY_S = 2.0
# How far back the readmission's window looks (lifecycle._healthy: at most 600 s).
LOOKBACK_S = 600.0


def export(
    session: Session, gpus: dict[int, tuple[str, str]], since: float, until: float
) -> list[dict[str, Any]]:
    """The spans of the GPUs `gpus` ({gpu id: (node name, uuid)}) between since and until."""
    spans: list[dict[str, Any]] = []
    if not gpus:
        return spans
    rows = session.execute(
        select(Sample.gpu_id, Sample.ts, Sample.util, Sample.temp_c, Sample.power_w)
        .where(Sample.gpu_id.in_(list(gpus)), in_sample_window(since, until))
        .order_by(Sample.gpu_id, Sample.ts),
        execution_options={"yield_per": 20_000},
    )
    cur: dict[str, Any] | None = None
    cur_gpu = None
    for gid, ts, util, temp, power in rows:
        lost = util is None and temp is None and power is None
        if (
            cur is not None
            and gid == cur_gpu
            and cur["lost"] == lost
            and ts - cur["to"] <= SPAN_GAP_S
        ):
            cur["to"] = ts
            continue
        node, uuid = gpus[gid]
        cur, cur_gpu = {"node": node, "gpu": uuid, "from": ts, "to": ts, "lost": lost}, gid
        spans.append(cur)
    return spans


class Spans:
    """A trace's spans, written back as samples into the replay's database as the clock
    passes, for the GPUs of cordoned nodes."""

    def __init__(self, spans: list[dict[str, Any]]) -> None:
        self.by_node: dict[str, list[dict[str, Any]]] = {}
        for sp in spans:
            self.by_node.setdefault(sp["node"], []).append(sp)
        self.done: dict[str, float] = {}  # node -> samples written up to here

    def advance(self, s: Session, t: float) -> None:
        if not self.by_node:
            return
        cordoned = s.scalars(select(Node.name).where(Node.cordoned.is_(True))).all()
        for node in cordoned:
            spans = self.by_node.get(node)
            if not spans:
                continue
            start = max(self.done.get(node, float("-inf")), t - LOOKBACK_S)
            self.done[node] = t
            ids = dict(
                s.execute(
                    select(Gpu.uuid, Gpu.id)
                    .join(Node, Node.id == Gpu.node_id)
                    .where(Node.name == node)
                ).all()
            )
            rows = [
                {
                    "gpu_id": ids[sp["gpu"]],
                    "ts": ts,
                    "util": None if sp["lost"] else 0.0,
                    "temp_c": None if sp["lost"] else 0.0,
                    "power_w": None if sp["lost"] else 0.0,
                }
                for sp in spans
                if sp["gpu"] in ids and sp["to"] > start and sp["from"] <= t
                for ts in _instants(max(sp["from"], start), min(sp["to"], t), sp["from"])
            ]
            if rows:
                s.execute(insert(Sample), rows)


def _instants(lo: float, hi: float, origin: float) -> list[float]:
    """The instants origin + k x SAMPLE_EVERY_S in (lo, hi], and hi (a span's end)."""
    k = int((lo - origin) // SAMPLE_EVERY_S) + 1
    out = []
    while (ts := origin + k * SAMPLE_EVERY_S) < hi:
        if ts > lo:
            out.append(ts)
        k += 1
    if hi > lo or hi == origin:
        out.append(hi)
    return out
