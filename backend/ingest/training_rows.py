"""The ingest writer's statements for what the training ranks report: events, jobs,
steps and ranks (BulkStatements in statements.py stores nodes, GPUs and samples and
calls these in the same transaction)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, insert, or_, select, update
from sqlalchemy.engine import Connection

from trainguard.backend.jobs.service import UNLISTED_S
from trainguard.backend.models import Event, Job, NodeLauncher, Rank, Step
from trainguard.protocol import wire

if TYPE_CHECKING:
    from trainguard.backend.ingest.statements import _Item


def _timeouts(value: wire.Timeouts | None) -> dict[str, Any] | None:
    """A rank's reported timeouts as stored: the values it has (None: none)."""
    if value is None:
        return None
    return {k: v for k in value.__struct_fields__ if (v := getattr(value, k)) is not None}


class TrainingStatements:
    """The training side of BulkStatements (the state it declares is set by IngestWriter)."""

    _pg: bool
    _job_ids: dict[str, int]

    def _insert_ignore(self, table: Any) -> Any:
        raise NotImplementedError  # BulkStatements': the dialect's INSERT .. ON CONFLICT

    def _insert_events(
        self, conn: Connection, fresh: list[tuple[_Item, int]]
    ) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = [
            {
                "node_id": nid,
                "ts": e.ts,
                "received_at": it.received_at,
                "kind": e.kind,
                "gpu_uuid": e.gpu_uuid,
                "job": e.job,
                "rank": e.rank,
                "xid": e.xid,
                "message": e.message,
                "data": dict(e.data),
            }
            for it, nid in fresh
            for e in it.batch.events
        ]
        if not rows:
            return []
        ids = conn.execute(insert(Event).returning(Event.id, sort_by_parameter_order=True), rows)
        names = {nid: it.batch.node for it, nid in fresh}
        out = []
        for (eid,), row in zip(ids.all(), rows, strict=True):
            out.append({"id": eid, **row, "node": names.get(row["node_id"])})
        return out

    def _resolve_jobs(self, conn: Connection, names: set[str], now: float) -> dict[str, int]:
        missing = [n for n in names if n not in self._job_ids]
        if missing:
            conn.execute(
                self._insert_ignore(Job).on_conflict_do_nothing(index_elements=["name"]),
                [
                    {
                        "name": n,
                        "first_seen": now,
                        "last_seen": now,
                        "world_size": 1,
                        "attempt": 0,
                        "iteration": 0,
                    }
                    for n in missing
                ],
            )
            for jid, name in conn.execute(select(Job.id, Job.name).where(Job.name.in_(missing))):
                self._job_ids[name] = jid
        return {n: self._job_ids[n] for n in names}

    def _unlisted_ranks(self, conn: Connection, fresh: list[tuple[_Item, int]]) -> None:
        """A batch with a rank list carries its agent's whole rank table. A rank the
        database holds alive on that node that its agent has not listed for UNLISTED_S
        ended while the agent could not see it (the agent was down, or restarted and never
        heard from it again: a live rank re-registers with its next heartbeat, each
        second): it is no longer alive. Its exit is unknown (no rank_exit comes), which
        the engine's job states read as such (lifecycle.job_states)."""
        listed: dict[int, set[tuple[str, int]]] = {}
        as_of: dict[int, float] = {}
        for it, nid in fresh:
            if it.batch.ranks is None:
                continue  # not a rank table (an old agent's, or a split batch's other half)
            listed.setdefault(nid, set()).update((r.job, r.rank) for r in it.batch.ranks)
            as_of[nid] = max(as_of.get(nid, 0.0), it.received_at - UNLISTED_S)
        if not listed:
            return
        rows = conn.execute(
            select(Rank.id, Rank.node_id, Rank.rank, Rank.updated_at, Job.name)
            .join(Job, Job.id == Rank.job_id)
            .where(Rank.node_id.in_(listed), Rank.alive.is_(True))
        ).all()
        gone = [
            rid
            for rid, nid, rank, updated, job in rows
            if updated < as_of[nid] and (job, rank) not in listed[nid]
        ]
        if gone:
            conn.execute(update(Rank).where(Rank.id.in_(gone)).values(alive=False))

    def _store_launchers(
        self, conn: Connection, fresh: list[tuple[_Item, int]], job_ids: dict[str, int]
    ) -> None:
        """A batch with a launcher list carries all its node's launchers: the node's rows
        are replaced by the newest list (a node's batches come in order; of two in one
        group, the later)."""
        latest: dict[int, tuple[_Item, list[wire.LauncherStatus]]] = {}
        for it, nid in fresh:
            if it.batch.launchers is not None:
                latest[nid] = (it, it.batch.launchers)
        if not latest:
            return
        conn.execute(delete(NodeLauncher).where(NodeLauncher.node_id.in_(sorted(latest))))
        rows = [
            {
                "node_id": nid,
                "job_id": job_ids[lc.job],
                "pid": lc.pid,
                "state": lc.state,
                "launcher": lc.launcher,
                "min_nodes": lc.min_nodes,
                "max_nodes": lc.max_nodes,
                "ranks": lc.ranks,
                "started_at": lc.started_at,
                "reported_at": it.received_at,
            }
            for nid, (it, launchers) in sorted(latest.items())
            for lc in launchers
        ]
        if rows:
            conn.execute(insert(NodeLauncher), rows)

    def _store_jobs(self, conn: Connection, fresh: list[tuple[_Item, int]]) -> int:
        self._unlisted_ranks(conn, fresh)
        names = {s.job for it, _ in fresh for s in it.batch.steps}
        names |= {r.job for it, _ in fresh for r in it.batch.ranks or ()}
        names |= {lc.job for it, _ in fresh for lc in it.batch.launchers or ()}
        if not names:
            self._store_launchers(conn, fresh, {})
            return 0
        job_ids = self._resolve_jobs(conn, names, min(it.received_at for it, _ in fresh))
        self._store_launchers(conn, fresh, job_ids)
        steps = [
            {
                "job_id": job_ids[s.job],
                "node_id": nid,
                "rank": s.rank,
                "step": s.step,
                "start": s.start,
                "end": s.end,
                "attempt": s.attempt,
                "iteration": s.iteration,
                "compute_s": s.compute,
            }
            for it, nid in fresh
            for s in it.batch.steps
        ]
        if steps:
            conn.execute(insert(Step), steps)
        ranks: dict[tuple[int, int], dict[str, Any]] = {}
        for it, nid in fresh:
            for r in it.batch.ranks or ():
                ranks[(job_ids[r.job], r.rank)] = {
                    "job_id": job_ids[r.job],
                    "rank": r.rank,
                    "node_id": nid,
                    "local_rank": r.local_rank,
                    "pid": r.pid,
                    "attempt": r.attempt,
                    "iteration": r.iteration,
                    "last_heartbeat": r.last_heartbeat,
                    "last_step": r.last_step,
                    "alive": r.alive,
                    "updated_at": it.received_at,
                    # Declared by the SDK (wire fields added with it; None from older agents).
                    "in_process": getattr(r, "in_process", None),
                    "launcher": getattr(r, "launcher", None),
                    "max_restarts": r.max_restarts,
                    "restart_count": r.restart_count,
                    "timeouts": _timeouts(r.timeouts),
                }
        if ranks:
            stmt = self._insert_ignore(Rank)
            # A rank number lives where its newest process runs: a node that lists the
            # rank's old process, dead (its agent keeps the ended ranks it saw), does not
            # take the rank back from another node where it runs now (the exclusion's
            # spare took it; the excluded node, readmitted, still lists the old one).
            stmt = stmt.on_conflict_do_update(
                index_elements=["job_id", "rank"],
                set_={
                    c: stmt.excluded[c]
                    for c in next(iter(ranks.values()))
                    if c not in ("job_id", "rank")
                },
                where=or_(
                    stmt.excluded.alive.is_(True),
                    Rank.node_id == stmt.excluded.node_id,
                    Rank.alive.is_not(True),
                ),
            )
            conn.execute(stmt, list(ranks.values()))
        # Job summary: world size, generation, newest step.
        summary: dict[int, dict[str, Any]] = {}
        for it, _ in fresh:
            for r in it.batch.ranks or ():
                j = summary.setdefault(job_ids[r.job], {"last_seen": it.received_at})
                j["world_size"] = max(j.get("world_size", 1), r.world_size)
                j["attempt"] = max(j.get("attempt", 0), r.attempt)
                j["iteration"] = max(j.get("iteration", 0), r.iteration)
                display = getattr(r, "display_name", None)
                if display:
                    j["display_name"] = display
            for s in it.batch.steps:
                j = summary.setdefault(job_ids[s.job], {"last_seen": it.received_at})
                j["last_step"] = max(j.get("last_step", -1), s.step)
        # In id order: two processes updating the same jobs lock their rows in one order.
        for jid, vals in sorted(summary.items()):
            conn.execute(update(Job).where(Job.id == jid).values(**vals))
        return len(steps)
