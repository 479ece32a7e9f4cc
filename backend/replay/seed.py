"""The replay's database before its period: the recorded nodes, GPUs and jobs as first
seen, and the cordons in force when it starts (docs/replay.md, "What is replayed")."""

from __future__ import annotations

from sqlalchemy import insert, update
from sqlalchemy.orm import Session

from trainguard.backend.models import Gpu, Job, Node, NodeCordon
from trainguard.backend.replay.trace import Trace


def seed(s: Session, tr: Trace, node_ids: dict[str, int], job_ids: dict[str, int]) -> None:
    """Nodes, GPUs and jobs as first seen, and the cordons in force at the start."""
    first = tr.since
    s.execute(
        insert(Node),
        [
            {
                "id": node_ids[n["name"]],
                "name": n["name"],
                "simulated": bool(n.get("simulated")),
                "cordoned": False,
                "first_seen": n["first_seen"],
                "last_seen": min(n["first_seen"], first),
                "clock_offset_s": n.get("clock_offset_s"),
            }
            for n in tr["node"]
        ],
    ) if tr["node"] else None
    if tr["gpu"]:
        s.execute(
            insert(Gpu),
            [
                {"node_id": node_ids[g["node"]], "uuid": g["uuid"], "index": g["index"]}
                for g in tr["gpu"]
                if g["node"] in node_ids
            ],
        )
    if tr["job"]:
        s.execute(
            insert(Job),
            [
                {
                    "id": job_ids[j["name"]],
                    "name": j["name"],
                    "first_seen": j["first_seen"],
                    "last_seen": j["first_seen"],
                    "world_size": j.get("world_size") or 1,
                    "display_name": j.get("display_name"),
                    "attempt": 0,
                    "iteration": 0,
                    "state": "running",
                    "state_since": j["first_seen"],
                }
                for j in tr["job"]
            ],
        )
    for c in tr["cordon"]:
        node = c["node"]
        if node in node_ids and c["at"] < tr.since and c["released_at"] is None:
            s.execute(update(Node).where(Node.id == node_ids[node]).values(cordoned=True))
            s.add(
                NodeCordon(
                    node_id=node_ids[node],
                    at=c["at"],
                    by=c["by"],
                    reason="cordoned before the replayed period",
                )
            )
    s.flush()
