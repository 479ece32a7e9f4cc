"""`trainguard bench sample-layout`: what a row per GPU per batch would save against a row
per sample, as `samples` stores them now, measured before anything is built on it.

The same readings (one H100's, as `bench sample-index` writes them) in four tables, each
with the generated bucket and, all but `row-unindexed`, the index of `samples` (now
(bucket, gpu_id), migration 0012):

- `row`: `samples` itself (`LIKE samples`), a row per sample, written with the ingest
  writer's columns and binary COPY types;
- `row-unindexed`: the same rows without the index: the heap's share of `row`, and so
  what the index costs (a reference, not a layout to keep: reads need the index);
- `arrays`: a row per GPU per batch, each reading an array of the batch's samples (as
  psycopg dumps Python lists);
- `packed`: a row per GPU per batch (its first sample's ts), its samples as fixed-width
  little-endian records, ts first, in one bytea (`struct`). The records have no NULL
  bitmap: every reading here is present, and a real layout would add one (3 bytes a
  sample for 18 readings).

Each round writes `gpus` GPUs x `batch_s` samples into every layout, one transaction and
one COPY each, the layouts' order alternating between rounds. Reported per layout, the
median over the rounds: PostgreSQL's CPU per sample (the COPY's server process), the
client's CPU per sample (building the rows and the COPY, this process), WAL per sample;
and the table's size per sample after all rounds.
"""

from __future__ import annotations

import statistics
import struct
import time
from typing import Any

from trainguard.backend.bench.common import rss_cpu
from trainguard.backend.bench.sample_index import _READINGS, _T0
from trainguard.backend.ingest.statements import _PG_TYPES, SAMPLE_COLUMNS
from trainguard.backend.models import Sample

LAYOUTS = ("row", "row-unindexed", "arrays", "packed")
_TABLE = "bench_sample_layout_"
# One packed record: ts, then the readings in SAMPLE_COLUMNS order, each at its column's
# width (float4, float8, int8, int4, bool).
_FORMAT = {"float4": "f", "float8": "d", "int8": "q", "int4": "i", "int2": "h", "bool": "?"}
# The columns of `samples`' one index, from the model: every layout is indexed as it is.
# Unpacked, so a second index on `samples` stops the import instead of one being picked
# by a set's order.
(_INDEX,) = Sample.metadata.tables["samples"].indexes
_SAMPLES_INDEX = ", ".join(_INDEX.columns.keys())
RECORD = struct.Struct("<d" + "".join(_FORMAT[t] for t in _PG_TYPES[2:]))


def _table(layout: str) -> str:
    return _TABLE + layout.replace("-", "_")


def _create(conn: Any, layout: str) -> None:
    table = _table(layout)
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    if layout in ("row", "row-unindexed"):
        conn.execute(f"CREATE TABLE {table} (LIKE samples INCLUDING GENERATED)")
    else:
        readings = SAMPLE_COLUMNS[2:]
        values = (
            "tss float8[], "
            + ", ".join(f"{c} {t}[]" for c, t in zip(readings, _PG_TYPES[2:], strict=True))
            if layout == "arrays"
            else "n int2, records bytea"  # each record holds its ts
        )
        conn.execute(
            f"CREATE TABLE {table} (gpu_id integer, ts float8, {values}, "
            "bucket integer GENERATED ALWAYS AS (floor(ts / 8)::integer) STORED)"
        )
    if layout != "row-unindexed":
        conn.execute(f"CREATE INDEX ON {table} ({_SAMPLES_INDEX})")


def _write(conn: Any, layout: str, gpus: int, batch_s: int, base: float) -> None:
    table = _table(layout)
    if layout in ("row", "row-unindexed"):
        cols, types = ", ".join(SAMPLE_COLUMNS), _PG_TYPES
    elif layout == "arrays":
        cols = ", ".join(("gpu_id", "ts", "tss", *SAMPLE_COLUMNS[2:]))
        types = ["int4", "float8", "float8[]", *(f"{t}[]" for t in _PG_TYPES[2:])]
    else:
        cols, types = "gpu_id, ts, n, records", ["int4", "float8", "int2", "bytea"]
    with (
        conn.transaction(),
        conn.cursor() as cur,
        cur.copy(f"COPY {table} ({cols}) FROM STDIN (FORMAT BINARY)") as copy,
    ):
        copy.set_types(types)
        for gpu in range(1, gpus + 1):
            stamps = [base + k + 0.001 * (gpu % 997) for k in range(batch_s)]
            if layout in ("row", "row-unindexed"):
                for ts in stamps:
                    copy.write_row((gpu, ts, *_READINGS))
            elif layout == "arrays":
                columns = [[value] * batch_s for value in _READINGS]
                copy.write_row((gpu, stamps[0], stamps, *columns))
            else:
                records = b"".join([RECORD.pack(ts, *_READINGS) for ts in stamps])
                copy.write_row((gpu, stamps[0], batch_s, records))


def _one(conn: Any, sql: str, params: tuple[Any, ...] = ()) -> Any:
    """The one row a query returns."""
    return conn.execute(sql, params).fetchone()


def unpack(records: bytes) -> list[tuple[Any, ...]]:
    """A packed row's samples: (ts, readings...) each."""
    return list(RECORD.iter_unpack(records))


def run(database_url: str, gpus: int, batch_s: int, rounds: int) -> dict[str, Any]:
    """Every layout `rounds` times on `database_url` (PostgreSQL, at head); its scratch
    tables are dropped at the end."""
    import psycopg
    from sqlalchemy.engine import make_url

    from trainguard.backend import db

    db.upgrade(database_url)
    dsn = make_url(database_url).set(drivername="postgresql").render_as_string(False)
    per: dict[str, dict[str, list[float]]] = {
        layout: {"pg": [], "client": [], "wal": []} for layout in LAYOUTS
    }
    sizes: dict[str, dict[str, float]] = {}
    samples = gpus * batch_s
    with psycopg.connect(dsn, autocommit=True) as conn:
        pid = conn.info.backend_pid
        try:
            for layout in LAYOUTS:
                _create(conn, layout)
            for r in range(rounds):
                order = LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]
                for layout in order:
                    wal0 = _one(conn, "SELECT pg_current_wal_lsn()")[0]
                    pg0, client0 = rss_cpu(pid)[1], time.process_time()
                    _write(conn, layout, gpus, batch_s, _T0 + r * batch_s)
                    client1, pg1 = time.process_time(), rss_cpu(pid)[1]
                    wal = _one(conn, "SELECT pg_current_wal_lsn() - %s::pg_lsn", (str(wal0),))[0]
                    per[layout]["pg"].append(1e6 * (pg1 - pg0) / samples)
                    per[layout]["client"].append(1e6 * (client1 - client0) / samples)
                    per[layout]["wal"].append(float(wal) / samples)
            for layout in LAYOUTS:
                table = _table(layout)
                size, rows = _one(
                    conn, f"SELECT pg_total_relation_size('{table}'), count(*) FROM {table}"
                )
                sizes[layout] = {"rows": rows, "bytes": size}
        finally:
            for layout in LAYOUTS:
                conn.execute(f"DROP TABLE IF EXISTS {_table(layout)}")
    return {
        "gpus": gpus,
        "samples_per_gpu_per_batch": batch_s,
        "rounds": rounds,
        "layouts": [
            {
                "layout": layout,
                "rows": sizes[layout]["rows"],
                "pg_cpu_us_per_sample": round(statistics.median(per[layout]["pg"]), 2),
                "client_cpu_us_per_sample": round(statistics.median(per[layout]["client"]), 2),
                "wal_bytes_per_sample": round(statistics.median(per[layout]["wal"]), 1),
                "table_bytes_per_sample": round(sizes[layout]["bytes"] / (samples * rounds), 1),
            }
            for layout in LAYOUTS
        ],
    }


def table(result: dict[str, Any]) -> str:
    head = (
        "| layout | rows | PG µs/sample | client µs/sample | WAL B/sample | table B/sample |\n"
        "|---|---|---|---|---|---|\n"
    )
    return head + "\n".join(
        f"| {x['layout']} | {x['rows']:,} | {x['pg_cpu_us_per_sample']} | "
        f"{x['client_cpu_us_per_sample']} | {x['wal_bytes_per_sample']} | "
        f"{x['table_bytes_per_sample']} |"
        for x in result["layouts"]
    )
