"""The ingest hot path: group commit of concurrent batches into bulk statements.

Every accepted batch is handed to one writer thread per process. The thread takes all
batches waiting (up to a row cap), stores them in ONE transaction with bulk statements
(binary COPY on PostgreSQL, executemany on SQLite), then resolves each batch's future. The
HTTP answer therefore means "stored": an agent that gets 200 may forget the batch.
A replayed (node, agent_id, seq) is detected against ingest_batches and stored once.
If the transaction fails, every batch in it fails (503 to its agent, which retries);
nothing is ever half-stored. A failure that is not the database's (a value a column cannot
hold) is retried batch by batch, so only the culprit is refused (422) and its neighbours
are stored.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from sqlalchemy import (
    REAL,
    BigInteger,
    Boolean,
    Engine,
    Float,
    Integer,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DataError as SADataError
from sqlalchemy.exc import DBAPIError, InterfaceError
from sqlalchemy.exc import OperationalError as SAOperationalError

from trainguard.backend.db import write_waiters
from trainguard.backend.models import (
    SAMPLE_READINGS,
    Event,
    Gpu,
    IngestBatch,
    Job,
    Node,
    Rank,
    Sample,
    Step,
)
from trainguard.protocol.wire import Batch, IngestResult

log = logging.getLogger(__name__)

SAMPLE_COLUMNS = ("gpu_id", "ts", *SAMPLE_READINGS)


def _pg_type(col: str) -> str:
    """Binary COPY needs each column's exact PostgreSQL type; derive it from the model."""
    t = Sample.__table__.c[col].type
    if isinstance(t, REAL):
        return "float4"
    if isinstance(t, Float):
        return "float8"
    if isinstance(t, Boolean):
        return "bool"
    if isinstance(t, BigInteger):
        return "int8"
    if isinstance(t, Integer):
        return "int4"
    raise TypeError(f"no COPY type for samples.{col} ({t!r})")


_PG_TYPES = [_pg_type(c) for c in SAMPLE_COLUMNS]
_SAMPLE_FIELDS = attrgetter(*SAMPLE_COLUMNS[1:])  # a wire sample's values, column order


# PostgreSQL: the group's batch keys and node updates as one statement each, arrays in
# (the same text every time, so psycopg parses it once; SQLAlchemy's insertmanyvalues and
# executemany rebuild a statement or a parameter set per group or per row).
_BATCH_KEY_COLUMNS = ("node_id", "agent_id", "seq", "received_at", "samples")
_PG_INSERT_BATCH_KEYS = f"""
INSERT INTO ingest_batches ({", ".join(_BATCH_KEY_COLUMNS)})
SELECT * FROM unnest(%s::int4[], %s::text[], %s::int8[], %s::float8[], %s::int4[])
ON CONFLICT DO NOTHING
RETURNING node_id, agent_id, seq
"""
_PG_UPDATE_NODES_ARGS = (
    "b_id",
    "last_seen",
    "agent_id",
    "clock_offset_s",
    "simulated",
    "has_samples",
    "util_avg",
    "temp_max",
    "last_xid_at",
)
_PG_UPDATE_NODES = """
UPDATE nodes AS n SET
    last_seen = v.last_seen,
    agent_id = v.agent_id,
    clock_offset_s = v.clock_offset_s,
    simulated = v.simulated,
    util_avg = CASE WHEN v.has_samples THEN v.util_avg ELSE n.util_avg END,
    temp_max = CASE WHEN v.has_samples THEN v.temp_max ELSE n.temp_max END,
    last_xid_at = COALESCE(v.last_xid_at, n.last_xid_at)
FROM unnest(%s::int4[], %s::float8[], %s::text[], %s::float8[], %s::bool[], %s::bool[],
            %s::float8[], %s::float8[], %s::float8[])
    AS v(id, last_seen, agent_id, clock_offset_s, simulated, has_samples, util_avg,
         temp_max, last_xid_at)
WHERE n.id = v.id
"""


class DatabaseUnavailable(Exception):
    """The batch was not stored because of the database (down, busy, failing): retry."""


class BatchRefused(Exception):
    """The database refused this batch's values (it was stored alone, so it is this one)."""


def _driver_error(exc: BaseException, *names: str) -> bool:
    """The COPY path uses psycopg directly: its errors are not wrapped by SQLAlchemy."""
    return any(
        c.__module__.startswith("psycopg") and c.__name__ in names for c in type(exc).__mro__
    )


def _unreachable(exc: BaseException) -> bool:
    """A lost or refused connection: every batch would fail the same way."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, SAOperationalError | InterfaceError | ConnectionError):
        return True
    return _driver_error(exc, "OperationalError", "InterfaceError")


def _data_error(exc: BaseException) -> bool:
    """A value the database cannot hold: the batch's fault, retrying will not help."""
    return isinstance(exc, SADataError | OverflowError) or _driver_error(exc, "DataError")


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:300]


@dataclass
class _Item:
    batch: Batch
    received_at: float
    future: Future[IngestResult] = field(default_factory=Future)


@dataclass
class Stored:
    """What one transaction stored; handed to listeners (the live bus) after commit."""

    batches: list[tuple[Batch, float]]
    events: list[dict[str, Any]]


class IngestWriter:
    def __init__(
        self,
        engine: Engine,
        max_delay_s: float = 0.05,
        max_rows: int = 200_000,
        on_stored: Callable[[Stored], None] | None = None,
        yield_max_s: float = 0.2,
    ) -> None:
        self.engine = engine
        self.yield_max_s = yield_max_s
        self.max_delay_s = max_delay_s
        self.max_rows = max_rows
        self.on_stored = on_stored
        self._q: queue.Queue[_Item | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)
        self._pg = engine.dialect.name == "postgresql"
        self._waiters = write_waiters(engine)
        self._node_ids: dict[str, int] = {}
        self._gpu_ids: dict[str, int] = {}
        self._job_ids: dict[str, int] = {}
        self._conn: Connection | None = None
        self.stats = {
            "batches": 0,
            "duplicates": 0,
            "samples": 0,
            "transactions": 0,
            "failed": 0,
            "yielded": 0,  # SQLite: commits after which a waiting write was let in first
        }

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Drain what is queued, then end the thread."""
        self._q.put(None)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._drop_connection()

    def submit(self, batch: Batch, received_at: float) -> Future[IngestResult]:
        item = _Item(batch, received_at)
        self._q.put(item)
        return item.future

    # --- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._q.get()
            if first is None:
                break
            group = [first]
            rows = len(first.batch.samples)
            deadline = time.monotonic() + self.max_delay_s
            # Evidence (XIDs, rank exits, ...) is what the decision engine waits for:
            # a group holding events is stored at once, never held back for company.
            urgent = bool(first.batch.events)
            # Take everything already queued; wait a little for more only while the
            # group is small, so a lone batch is not delayed for long.
            while rows < self.max_rows:
                try:
                    wait = len(group) < 4 and not urgent
                    timeout = max(0.0, deadline - time.monotonic()) if wait else 0
                    item = self._q.get(timeout=timeout) if timeout else self._q.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                group.append(item)
                rows += len(item.batch.samples)
                urgent = urgent or bool(item.batch.events)
            # Under load a group holds hundreds of routine batches: the evidence in it goes
            # first, in a transaction of its own, so the engine is not kept waiting.
            urgent_items = [it for it in group if it.batch.events]
            if 0 < len(urgent_items) < len(group):
                self._store_group(urgent_items)
                self._store_group([it for it in group if not it.batch.events])
            else:
                self._store_group(group)

    def _connection(self) -> Connection:
        """The writer's own connection, kept between transactions: a pool checkout pings
        the database first (pool_pre_ping), one round trip per group for nothing."""
        if self._conn is None or self._conn.closed or self._conn.invalidated:
            self._conn = self.engine.connect()
            self._conn.info["ingest_writer"] = True  # not counted as a waiting writer
        return self._conn

    def _forget_ids(self) -> None:
        """After a failed transaction: ids cached inside it may have been rolled back."""
        self._node_ids.clear()
        self._gpu_ids.clear()
        self._job_ids.clear()

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.invalidate()
                self._conn.close()
            self._conn = None

    def _transaction(self, group: list[_Item]) -> tuple[list[IngestResult], Stored]:
        reused = self._conn is not None
        try:
            conn = self._connection()
            with conn.begin():
                return self._store(conn, group)
        except Exception as exc:
            if not _unreachable(exc):
                raise  # rolled back; the connection itself is fine
            self._drop_connection()
            if not reused:
                raise
        # The kept connection went stale (a database restart, an idle timeout): what the
        # pool's ping would have caught. Once more on a fresh one, forgetting the ids
        # the rolled-back attempt may have cached.
        self._forget_ids()
        log.info("ingest writer: reconnecting to the database")
        conn = self._connection()
        with conn.begin():
            return self._store(conn, group)

    def _store_group(self, group: list[_Item]) -> None:
        try:
            results, stored = self._transaction(group)
        except Exception as exc:
            if _unreachable(exc):
                self._drop_connection()
            self._forget_ids()
            if len(group) > 1 and not _unreachable(exc):
                # Something in one batch, not the database: store each batch on its own so
                # the others are not refused (or retried forever) along with it.
                log.warning(
                    "ingest transaction failed (%d batches): %s; one by one", len(group), exc
                )
                for item in group:
                    self._store_group([item])
                return
            self.stats["failed"] += len(group)
            error: Exception
            if _data_error(exc):
                error = BatchRefused(_first_line(exc))
                log.warning("ingest batch refused by the database: %s", _first_line(exc))
            else:
                error = DatabaseUnavailable(_first_line(exc))
                log.warning(
                    "ingest transaction failed (%d batches): %s",
                    len(group),
                    exc,
                    exc_info=not _unreachable(exc),
                )
            for item in group:
                item.future.set_exception(error)
            return
        self.stats["transactions"] += 1
        for item, result in zip(group, results, strict=True):
            item.future.set_result(result)
        if self.on_stored and stored.batches:
            try:
                self.on_stored(stored)
            except Exception:  # a live-bus problem must never fail ingest
                log.exception("on_stored listener failed")
        if self._waiters is not None and self._waiters.count:
            # SQLite: a write (an agent's ack, the engine) waits for the lock; let it in
            # before the next group takes the lock again (backend/db.py: WriteWaiters).
            self.stats["yielded"] += 1
            self._waiters.yield_to(self.yield_max_s)

    def _store(self, conn: Connection, group: list[_Item]) -> tuple[list[IngestResult], Stored]:
        node_ids = self._resolve_nodes(
            conn, {it.batch.node for it in group}, min(it.received_at for it in group)
        )
        keys = [(node_ids[it.batch.node], it.batch.agent_id, it.batch.seq) for it in group]
        # Dedup: the same batch twice in this group, then batches already stored: the
        # insert of the batch keys skips those (ON CONFLICT DO NOTHING) and returns the
        # keys it did insert, one round trip for both.
        first: dict[tuple[int, str, int], _Item] = {}
        for it, key in zip(group, keys, strict=True):
            first.setdefault(key, it)
        rows = [
            {
                "node_id": key[0],
                "agent_id": key[1],
                "seq": key[2],
                "received_at": it.received_at,
                "samples": len(it.batch.samples),
            }
            for key, it in first.items()
        ]
        if self._pg:
            arrays = tuple([r[c] for r in rows] for c in _BATCH_KEY_COLUMNS)
            found = conn.exec_driver_sql(_PG_INSERT_BATCH_KEYS, arrays)
        else:
            found = conn.execute(
                self._insert_ignore(IngestBatch)
                .on_conflict_do_nothing()
                .returning(IngestBatch.node_id, IngestBatch.agent_id, IngestBatch.seq),
                rows,
            )
        inserted = {(r[0], r[1], r[2]) for r in found}
        fresh: list[tuple[_Item, int]] = []
        dup_flags = []
        for it, key in zip(group, keys, strict=True):
            dup = key not in inserted or first[key] is not it
            dup_flags.append(dup)
            if not dup:
                fresh.append((it, key[0]))

        results: list[IngestResult] = []
        stored = Stored(batches=[], events=[])
        counts: dict[int, tuple[int, int, int]] = {}
        if fresh:
            self._update_nodes(conn, fresh)
            self._upsert_gpus(conn, fresh)
            n_samples = self._insert_samples(conn, fresh)
            events = self._insert_events(conn, fresh)
            n_steps = self._store_jobs(conn, fresh)
            stored.events = events
            stored.batches = [(it.batch, it.received_at) for it, _ in fresh]
            for it, _ in fresh:
                counts[id(it)] = (len(it.batch.samples), len(it.batch.events), len(it.batch.steps))
            self.stats["samples"] += n_samples
            del n_steps
        for it, dup in zip(group, dup_flags, strict=True):
            s, e, st = (0, 0, 0) if dup else counts[id(it)]
            results.append(
                IngestResult(
                    seq=it.batch.seq,
                    duplicate=dup,
                    stored_samples=s,
                    stored_events=e,
                    stored_steps=st,
                    received_at=it.received_at,
                )
            )
        self.stats["batches"] += len(fresh)
        self.stats["duplicates"] += len(group) - len(fresh)
        return results, stored

    # --- pieces ----------------------------------------------------------------------

    def _insert_ignore(self, table: Any) -> Any:
        return (pg_insert if self._pg else sqlite_insert)(table)

    def _resolve_nodes(self, conn: Connection, names: set[str], now: float) -> dict[str, int]:
        missing = [n for n in names if n not in self._node_ids]
        if missing:
            conn.execute(
                self._insert_ignore(Node).on_conflict_do_nothing(index_elements=["name"]),
                [
                    {
                        "name": n,
                        "first_seen": now,
                        "last_seen": now,
                        "simulated": False,
                        "cordoned": False,
                    }
                    for n in missing
                ],
            )
            for nid, name in conn.execute(select(Node.id, Node.name).where(Node.name.in_(missing))):
                self._node_ids[name] = nid
        return {n: self._node_ids[n] for n in names}

    def _update_nodes(self, conn: Connection, fresh: list[tuple[_Item, int]]) -> None:
        latest: dict[int, dict[str, Any]] = {}
        for it, nid in fresh:
            b = it.batch
            utils = [s.util for s in b.samples if s.util is not None]
            temps = [s.temp_c for s in b.samples if s.temp_c is not None]
            row = latest.setdefault(nid, {"b_id": nid})
            row.update(
                last_seen=it.received_at,
                agent_id=b.agent_id,
                clock_offset_s=b.sent_at - it.received_at,
                simulated=b.simulated,
            )
            if b.samples:
                row["util_avg"] = sum(utils) / len(utils) if utils else None
                row["temp_max"] = max(temps) if temps else None
            xids = [e.ts for e in b.events if e.kind in ("xid", "gpu_lost")]
            if xids:
                row["last_xid_at"] = max(xids)
        if self._pg:
            self._update_nodes_pg(conn, list(latest.values()))
            return
        from sqlalchemy import bindparam

        # Group rows by their key set so each executemany has one statement shape.
        shapes: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for row in latest.values():
            shapes.setdefault(tuple(sorted(row)), []).append(row)
        for shape, rows in shapes.items():
            values = {k: bindparam(k) for k in shape if k != "b_id"}
            conn.execute(
                update(Node).where(Node.id == bindparam("b_id")).values(**values),
                rows,
                execution_options={"synchronize_session": False},
            )

    def _update_nodes_pg(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """One UPDATE .. FROM unnest(arrays) for every node in the group: one statement
        text whatever the group's size, where an executemany costs a round of parameter
        handling per row (py-spy: most of the writer's own CPU at 512 batches/s)."""
        cols = {k: [r.get(k) for r in rows] for k in _PG_UPDATE_NODES_ARGS}
        cols["has_samples"] = ["util_avg" in r for r in rows]
        conn.exec_driver_sql(_PG_UPDATE_NODES, tuple(cols[k] for k in _PG_UPDATE_NODES_ARGS))

    def _upsert_gpus(self, conn: Connection, fresh: list[tuple[_Item, int]]) -> None:
        rows: dict[str, dict[str, Any]] = {}
        for it, nid in fresh:
            b = it.batch
            for g in b.gpus or ():
                rows[g.uuid] = {
                    "node_id": nid,
                    "uuid": g.uuid,
                    "index": g.index,
                    "name": g.name,
                    "pci_bus_id": g.pci_bus_id,
                    "memory_total_mib": g.memory_total_mib,
                    "power_limit_w": g.power_limit_w,
                    "simulated": b.simulated,
                }
            for s in b.samples:
                if s.uuid not in self._gpu_ids and s.uuid not in rows:
                    # A sample before its inventory (e.g. the inventory batch was lost
                    # from a full spool): record the GPU; a later inventory fills it in.
                    rows[s.uuid] = {
                        "node_id": nid,
                        "uuid": s.uuid,
                        "index": -1,
                        "name": "",
                        "pci_bus_id": "",
                        "memory_total_mib": None,
                        "power_limit_w": None,
                        "simulated": b.simulated,
                    }
        if not rows:
            return
        inventory = [r for r in rows.values() if r["index"] >= 0]
        placeholders = [r for r in rows.values() if r["index"] < 0]
        if inventory:
            stmt = self._insert_ignore(Gpu)
            stmt = stmt.on_conflict_do_update(
                index_elements=["uuid"],
                set_={c: stmt.excluded[c] for c in inventory[0] if c != "uuid"},
            )
            conn.execute(stmt, inventory)
        if placeholders:
            conn.execute(
                self._insert_ignore(Gpu).on_conflict_do_nothing(index_elements=["uuid"]),
                placeholders,
            )
        for gid, uuid in conn.execute(select(Gpu.id, Gpu.uuid).where(Gpu.uuid.in_(list(rows)))):
            self._gpu_ids[uuid] = gid

    def _insert_samples(self, conn: Connection, fresh: list[tuple[_Item, int]]) -> int:
        gpu_ids, readings = self._gpu_ids, _SAMPLE_FIELDS
        # attrgetter builds each row in C: 2.5x faster than a generator over the fields,
        # and this loop holds the GIL the request handlers need.
        rows = [(gpu_ids[s.uuid], *readings(s)) for it, _ in fresh for s in it.batch.samples]
        if not rows:
            return 0
        dbapi = conn.connection.driver_connection
        cols = ", ".join(SAMPLE_COLUMNS)
        if self._pg:
            with (
                dbapi.cursor() as cur,  # type: ignore[union-attr]
                cur.copy(f"COPY samples ({cols}) FROM STDIN (FORMAT BINARY)") as copy,
            ):
                copy.set_types(_PG_TYPES)
                for r in rows:
                    copy.write_row(r)
        else:
            marks = ", ".join("?" * len(SAMPLE_COLUMNS))
            cur = dbapi.cursor()  # type: ignore[union-attr]
            cur.executemany(f"INSERT INTO samples ({cols}) VALUES ({marks})", rows)
            cur.close()
        return len(rows)

    def _insert_events(
        self, conn: Connection, fresh: list[tuple[_Item, int]]
    ) -> list[dict[str, Any]]:
        rows = [
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

    def _store_jobs(self, conn: Connection, fresh: list[tuple[_Item, int]]) -> int:
        names = {s.job for it, _ in fresh for s in it.batch.steps}
        names |= {r.job for it, _ in fresh for r in it.batch.ranks or ()}
        if not names:
            return 0
        job_ids = self._resolve_jobs(conn, names, min(it.received_at for it, _ in fresh))
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
                }
        if ranks:
            stmt = self._insert_ignore(Rank)
            stmt = stmt.on_conflict_do_update(
                index_elements=["job_id", "rank"],
                set_={
                    c: stmt.excluded[c]
                    for c in next(iter(ranks.values()))
                    if c not in ("job_id", "rank")
                },
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
        for jid, vals in summary.items():
            conn.execute(update(Job).where(Job.id == jid).values(**vals))
        return len(steps)
