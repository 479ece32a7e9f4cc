"""The ingest writer's statements, table by table: one group's transaction (IngestWriter,
backend/ingest/writer.py, runs it in its thread). The batch keys dedup replays, then nodes,
GPUs, samples, events, jobs, steps and ranks are stored with bulk statements: binary COPY
and unnest arrays on PostgreSQL, executemany on SQLite; the ids they resolve are cached
between transactions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import msgspec
from sqlalchemy import (
    REAL,
    BigInteger,
    BindParameter,
    Boolean,
    Float,
    Integer,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from trainguard.backend.ingest.training_rows import TrainingStatements
from trainguard.backend.models import (
    SAMPLE_READINGS,
    Gpu,
    IngestBatch,
    Node,
    Sample,
    no_reading,
)
from trainguard.protocol.wire import Batch, GpuSample, IngestResult

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
# A wire sample's fields are (uuid, ts, readings...) in the columns' order: a sample's row
# is its fields as a list with the uuid swapped for the GPU's id. msgspec copies the
# fields out in C, 3x faster than attrgetter and a new tuple (330 vs 1,040 ns a row).
_WIRE_ORDER = ("uuid", *SAMPLE_COLUMNS[1:])
if tuple(f.name for f in msgspec.structs.fields(GpuSample)) != _WIRE_ORDER:
    raise ImportError(f"wire.GpuSample's fields must be {_WIRE_ORDER} (the COPY rows)")
_TS = attrgetter("ts")


def _lost_gpus(samples: list[Any]) -> int:
    """GPUs whose latest sample in the batch has no reading at all (models.no_reading)."""
    # Sorted by time (a no-op pass for an agent's batch, which is in time order), the last
    # of each GPU is its latest.
    latest = {s.uuid: s for s in sorted(samples, key=_TS)}
    return sum(1 for s in latest.values() if no_reading(s))


def _array_literal(values: Sequence[Any]) -> str:
    """`values` as PostgreSQL's text form of an array, for a `%s::type[]` parameter: an
    int or a float as its repr (which float8 reads back exactly, nan and inf included), a
    bool as True/False, a str double-quoted, None as NULL. Handed a list, psycopg dumps it
    element by element in Python: 1.3 us an element here, 11 % of the writer thread's CPU
    in rounds of 2,048 batches; the literal costs a third of that, and PostgreSQL parses
    the same text as before (docs/benchmarks.md, "The pruner's first run, and a leaner
    load generator": the writer's arrays)."""
    return (
        "{"
        + ",".join(
            [
                "NULL"
                if v is None
                else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
                if isinstance(v, str)
                else repr(v)
                for v in values
            ]
        )
        + "}"
    )


# PostgreSQL: the group's batch keys and node updates as one statement each, arrays in
# (the same text every time, so psycopg parses it once; SQLAlchemy's insertmanyvalues and
# executemany rebuild a statement or a parameter set per group or per row).
_BATCH_KEY_COLUMNS = ("node_id", "agent_id", "seq", "received_at", "samples", "going_away")
_PG_INSERT_BATCH_KEYS = f"""
INSERT INTO ingest_batches ({", ".join(_BATCH_KEY_COLUMNS)})
SELECT * FROM unnest(%s::int4[], %s::text[], %s::int8[], %s::float8[], %s::int4[], %s::text[])
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
    "gpus_lost",
    "last_xid_at",
    "going_away",
)
_PG_UPDATE_NODES = """
UPDATE nodes AS n SET
    last_seen = v.last_seen,
    agent_id = v.agent_id,
    clock_offset_s = v.clock_offset_s,
    simulated = v.simulated,
    util_avg = CASE WHEN v.has_samples THEN v.util_avg ELSE n.util_avg END,
    temp_max = CASE WHEN v.has_samples THEN v.temp_max ELSE n.temp_max END,
    gpus_lost = CASE WHEN v.has_samples THEN v.gpus_lost ELSE n.gpus_lost END,
    last_xid_at = COALESCE(v.last_xid_at, n.last_xid_at),
    going_away = v.going_away
FROM unnest(%s::int4[], %s::float8[], %s::text[], %s::float8[], %s::bool[], %s::bool[],
            %s::float8[], %s::float8[], %s::int4[], %s::float8[], %s::text[])
    AS v(id, last_seen, agent_id, clock_offset_s, simulated, has_samples, util_avg,
         temp_max, gpus_lost, last_xid_at, going_away)
WHERE n.id = v.id
"""


# A node's first batch registers it and its GPUs (a cluster-wide agent restart is a burst
# of those): on PostgreSQL one statement per table for the whole group, arrays in, ids
# back. SQLAlchemy's executemany of the upsert ran one statement per GPU: 2.1 s for a
# group of 3,000 new nodes, more than COPYing their samples (py-spy, docs/benchmarks.md).
_PG_INSERT_NODES = """
INSERT INTO nodes (name, first_seen, last_seen, simulated, cordoned)
SELECT n, %s, %s, false, false FROM unnest(%s::text[]) AS n
ON CONFLICT (name) DO NOTHING
RETURNING id, name
"""
_GPU_COLUMNS = (
    "node_id",
    "uuid",
    "index",
    "name",
    "pci_bus_id",
    "memory_total_mib",
    "power_limit_w",
    "simulated",
)
_PG_UPSERT_GPUS = f"""
INSERT INTO gpus (node_id, uuid, "index", name, pci_bus_id, memory_total_mib, power_limit_w,
                  simulated)
SELECT * FROM unnest(%s::int4[], %s::text[], %s::int4[], %s::text[], %s::text[],
                     %s::float8[], %s::float8[], %s::bool[])
ON CONFLICT (uuid) DO UPDATE SET
    {", ".join(f'"{c}" = excluded."{c}"' for c in _GPU_COLUMNS if c != "uuid")}
RETURNING id, uuid
"""


@dataclass
class _Item:
    """A batch waiting for its group commit, and who waits for it: a thread (`future`,
    IngestWriter.submit) or a coroutine on an event loop (`waiter`, submit_async)."""

    batch: Batch
    received_at: float
    future: Future[IngestResult] | None = None
    waiter: asyncio.Future[IngestResult] | None = None
    queued_at: float = field(default_factory=time.monotonic)  # for the writer's queue wait


@dataclass
class Stored:
    """What one transaction stored; handed to listeners (the live bus) after commit."""

    batches: list[tuple[Batch, float]]
    events: list[dict[str, Any]]


def _sample_rows(gpu_ids: dict[str, int], batches: list[Batch]) -> Iterator[Sequence[Any]]:
    """The batches' samples as rows of SAMPLE_COLUMNS, one at a time."""
    fields = msgspec.structs.astuple
    for b in batches:
        for s in b.samples:
            row = list(fields(s))
            row[0] = gpu_ids[s.uuid]
            yield row


class BulkStatements(TrainingStatements):
    """The statements of one group's transaction: IngestWriter (writer.py) sets the state
    declared here and calls `_store` inside its transaction. The events', jobs', steps'
    and ranks' statements are TrainingStatements' (training_rows.py)."""

    _pg: bool
    _node_ids: dict[str, int]
    _gpu_ids: dict[str, int]
    _job_ids: dict[str, int]
    stats: dict[str, int]

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
                "going_away": it.batch.going_away,
            }
            for key, it in first.items()
        ]
        if self._pg:
            arrays = tuple(_array_literal([r[c] for r in rows]) for c in _BATCH_KEY_COLUMNS)
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
        if missing and self._pg:
            # Sorted, as the GPUs below: two processes registering the same nodes at once
            # take their unique-key locks in one order, so neither waits for the other twice.
            missing.sort()
            found = conn.exec_driver_sql(_PG_INSERT_NODES, (now, now, missing))
            self._node_ids.update((name, nid) for nid, name in found)
            # Those that existed already (or that another process registered meanwhile:
            # this statement's snapshot predates its commit) are read on their own.
            missing = [n for n in missing if n not in self._node_ids]
            if missing:
                for nid, name in conn.execute(
                    select(Node.id, Node.name).where(Node.name.in_(missing))
                ):
                    self._node_ids[name] = nid
        elif missing:
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
                going_away=b.going_away,  # the agent's goodbye; any later batch clears it
            )
            if b.samples:
                row["util_avg"] = sum(utils) / len(utils) if utils else None
                row["temp_max"] = max(temps) if temps else None
                # A lost GPU's sample has no reading at all, util included: a batch whose
                # every sample has a utilization has none (the agent's usual batch),
                # and the latest of each GPU is not looked for.
                row["gpus_lost"] = 0 if len(utils) == len(b.samples) else _lost_gpus(b.samples)
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
            values: dict[str, BindParameter[Any]] = {k: bindparam(k) for k in shape if k != "b_id"}
            conn.execute(
                update(Node).where(Node.id == bindparam("b_id")).values(**values),
                rows,
                execution_options={"synchronize_session": False},
            )

    def _update_nodes_pg(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """One UPDATE .. FROM unnest(arrays) for every node in the group: one statement
        text whatever the group's size, where an executemany costs a round of parameter
        handling per row (py-spy: most of the writer's own CPU at 512 batches/s).

        Planned at every execution (`prepare=False`), never from a plan psycopg prepared
        and PostgreSQL cached: a generic plan made while `nodes` was small (a fresh
        database, the first nodes registering) joins by a hash over a scan of the whole
        table, and nothing but an ANALYZE of `nodes` replaces it. At 16,384 nodes that
        plan read 0.7 M rows a second (2 M with the samples left out, the groups smaller)
        and cost PostgreSQL 0.07 cores (0.34); planned each time, a group of a few nodes
        is an index lookup per node (docs/benchmarks.md, "The nodes UPDATE's cached
        plan")."""
        cols = {k: [r.get(k) for r in rows] for k in _PG_UPDATE_NODES_ARGS}
        cols["has_samples"] = ["util_avg" in r for r in rows]
        dbapi = conn.connection.driver_connection
        with dbapi.cursor() as cur:  # type: ignore[union-attr]  # an open connection has a driver
            cur.execute(
                _PG_UPDATE_NODES,
                tuple(_array_literal(cols[k]) for k in _PG_UPDATE_NODES_ARGS),
                prepare=False,
            )

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
        if inventory and self._pg:
            inventory.sort(key=lambda r: r["uuid"])
            arrays = tuple([r[c] for r in inventory] for c in _GPU_COLUMNS)
            self._gpu_ids.update(
                (u, gid) for gid, u in conn.exec_driver_sql(_PG_UPSERT_GPUS, arrays)
            )
            if not placeholders:
                return
            rows = {r["uuid"]: r for r in placeholders}
        elif inventory:
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
        n = sum(len(it.batch.samples) for it, _ in fresh)
        if not n:
            return 0
        # Each row is made as it is written, never a list of them: a group's 16k+ rows held
        # at once outlived young collections and were walked again by older ones (4.0 ->
        # 2.8 us a row).
        rows = _sample_rows(self._gpu_ids, [it.batch for it, _ in fresh])
        dbapi = conn.connection.driver_connection
        cols = ", ".join(SAMPLE_COLUMNS)
        if self._pg:
            with (
                dbapi.cursor() as cur,  # type: ignore[union-attr]  # an open connection has a driver
                cur.copy(f"COPY samples ({cols}) FROM STDIN (FORMAT BINARY)") as copy,
            ):
                copy.set_types(_PG_TYPES)
                write = copy.write_row
                for r in rows:
                    write(r)
        else:
            marks = ", ".join("?" * len(SAMPLE_COLUMNS))
            cur = dbapi.cursor()  # type: ignore[union-attr]  # an open connection has a driver
            cur.executemany(f"INSERT INTO samples ({cols}) VALUES ({marks})", rows)
            cur.close()
        return n
