"""`trainguard bench sample-index`: PostgreSQL's cost per stored sample as the raw samples
accumulate, with the samples' index before migration 0011, (gpu_id, ts), after it,
(bucket, gpu_id, ts), and without ts, (bucket, gpu_id): an index whose key PostgreSQL can
deduplicate (a float8 in the key rules that out), a GPU's 8 samples of a bucket one entry.

The goal's write pattern, straight into PostgreSQL with no backend in between: `gpus`
GPUs, 8 a node; each second an eighth of the nodes (for a batch interval of 8 s) sends
its last 8 s of samples, and the second's batches are stored as about 20 group commits,
each one binary COPY of the ingest writer's columns and types, as the writer stores them.
The layouts are tables shaped like `samples` (its generated bucket included), differing
only in their index, written one after the other in the same run.

Reported per window of simulated seconds, per layout: PostgreSQL's CPU per row (the
server process of the COPY), the whole run's wall time per row, WAL per row, checkpoints,
and the buffers the server process had to write out itself to make room (dirty pages it
evicted: the index's working set outgrowing shared_buffers), the index blocks read in from
outside shared_buffers (pg_statio: evicted leaves read back, or new ones), and the
index's size per row at the end.
"""

from __future__ import annotations

import time
from typing import Any

from trainguard.backend.bench.common import rss_cpu
from trainguard.backend.bench.ingest import postgres_state
from trainguard.backend.ingest.statements import _PG_TYPES, SAMPLE_COLUMNS

LAYOUTS = {
    "gpu_ts": ("gpu_id", "ts"),
    "bucket_gpu_ts": ("bucket", "gpu_id", "ts"),
    "bucket_gpu": ("bucket", "gpu_id"),
}
_T0 = 1_700_000_000.0
# One H100's readings (SAMPLE_COLUMNS after gpu_id and ts).
_READINGS = (
    *(55.0, 40.0, 60000.0, 81559.0, 61.0, 70.0, 400.0, 1.2e8, 1980.0, 2619.0),
    *(0, 0, 0, 0, 0, False, False, 0),
)


# Buffers the client backends wrote out themselves: pg_stat_io from PostgreSQL 16 (17
# dropped pg_stat_bgwriter.buffers_backend), the bgwriter's counter before it.
_BACKEND_WRITES_IO = (
    "SELECT coalesce(sum(writes), 0) FROM pg_stat_io WHERE backend_type = 'client backend'"
)
_BACKEND_WRITES_BGWRITER = "SELECT buffers_backend FROM pg_stat_bgwriter"


def _reading(
    url: str, pid: int, mon: Any, table: str
) -> tuple[float, float, dict[str, Any], int, int]:
    """Now: wall clock, the COPY server process's CPU time, postgres_state, the buffers
    PostgreSQL's backends have written out themselves, and the table's index blocks read
    from outside shared_buffers."""
    has_io = mon.execute("SELECT to_regclass('pg_catalog.pg_stat_io') IS NOT NULL").fetchone()[0]
    written = mon.execute(_BACKEND_WRITES_IO if has_io else _BACKEND_WRITES_BGWRITER).fetchone()[0]
    # `mon` is in autocommit: each statement is a transaction of its own, with the
    # statistics as of now.
    index_read = mon.execute(
        "SELECT coalesce(idx_blks_read, 0) FROM pg_statio_user_tables WHERE relname = %s",
        (table,),
    ).fetchone()[0]
    return time.perf_counter(), rss_cpu(pid)[1], postgres_state(url), int(written), int(index_read)


def _write_second(conn: Any, table: str, sec: int, nodes: int, batch_s: int) -> int:
    """Simulated second `sec`: the nodes whose turn it is send their last `batch_s`
    seconds of samples, as ~20 group commits. Returns the rows written."""
    senders = range(sec % batch_s, nodes, batch_s)
    per = max(1, len(senders) // 20)
    cols = ", ".join(SAMPLE_COLUMNS)
    rows = 0
    for g in range(0, len(senders), per):
        with (
            conn.transaction(),
            conn.cursor() as cur,
            cur.copy(f"COPY {table} ({cols}) FROM STDIN (FORMAT BINARY)") as copy,
        ):
            copy.set_types(_PG_TYPES)
            for n in senders[g : g + per]:
                for k in range(batch_s):
                    # Agents' clocks: each node's samples a few ms apart from the others'.
                    ts = _T0 + sec - batch_s + 1 + k + 0.001 * (n % 997)
                    for i in range(8):
                        copy.write_row((n * 8 + i + 1, ts, *_READINGS))
                        rows += 1
    return rows


def _run_layout(
    url: str, conninfo: str, layout: str, gpus: int, seconds: int, window: int, batch_s: int
) -> tuple[list[dict[str, Any]], float]:
    """The layout's windows, and its index's bytes per row at the end."""
    import psycopg

    table = f"bench_sample_index_{layout}"
    out: list[dict[str, Any]] = []
    with (
        psycopg.connect(conninfo, autocommit=True) as conn,
        psycopg.connect(conninfo, autocommit=True) as mon,
    ):
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TABLE {table} (LIKE samples INCLUDING GENERATED)")
        conn.execute(f"CREATE INDEX ON {table} ({', '.join(LAYOUTS[layout])})")
        pid = conn.info.backend_pid
        try:
            start = _reading(url, pid, mon, table)
            rows = total = 0
            for sec in range(seconds):
                rows += _write_second(conn, table, sec, gpus // 8, batch_s)
                if (sec + 1) % window and sec + 1 != seconds:
                    continue
                now = _reading(url, pid, mon, table)
                out.append(
                    {
                        "layout": layout,
                        "simulated_s": sec + 1,
                        "rows": rows,
                        "pg_cpu_us_per_row": round(1e6 * (now[1] - start[1]) / rows, 2),
                        "wall_us_per_row": round(1e6 * (now[0] - start[0]) / rows, 2),
                        "wal_bytes_per_row": round(
                            (now[2]["wal_bytes"] - start[2]["wal_bytes"]) / rows, 1
                        ),
                        "checkpoints": now[2]["checkpoints"] - start[2]["checkpoints"],
                        "buffers_written_by_backend": now[3] - start[3],
                        "index_blocks_read": now[4] - start[4],
                    }
                )
                start, total, rows = now, total + rows, 0
            found = mon.execute("SELECT pg_indexes_size(%s::regclass)", (table,)).fetchone()
            size = round((found[0] if found else 0) / total, 1)
        finally:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    return out, size


def run(
    database_url: str,
    gpus: int,
    seconds: int,
    window: int,
    batch_s: int,
    layouts: list[str] | None = None,
) -> dict[str, Any]:
    """The layouts (all by default), one after the other, on `database_url` (PostgreSQL,
    at head)."""
    from sqlalchemy.engine import make_url

    from trainguard.backend import db

    db.upgrade(database_url)
    conninfo = make_url(database_url).set(drivername="postgresql")
    dsn = conninfo.render_as_string(hide_password=False)
    state = postgres_state(database_url)
    windows: list[dict[str, Any]] = []
    index_size: dict[str, float] = {}
    for layout in layouts or LAYOUTS:
        got, index_size[layout] = _run_layout(
            database_url, dsn, layout, gpus, seconds, window, batch_s
        )
        windows += got
    return {
        "gpus": gpus,
        "simulated_s": seconds,
        "batch_interval_s": batch_s,
        "postgres_shared_buffers": state["shared_buffers"],
        "postgres_max_wal_size": state["max_wal_size"],
        "windows": windows,
        "index_bytes_per_row": index_size,
    }


def table(result: dict[str, Any]) -> str:
    head = (
        f"{result['gpus']} GPUs, batches of {result['batch_interval_s']} s, shared_buffers "
        f"{result['postgres_shared_buffers']}, max_wal_size {result['postgres_max_wal_size']}"
    )
    cols = [
        "layout",
        "simulated_s",
        "pg_cpu_us_per_row",
        "wall_us_per_row",
        "wal_bytes_per_row",
        "checkpoints",
        "buffers_written_by_backend",
        "index_blocks_read",
    ]
    lines = [head, "  ".join(cols)]
    for w in result["windows"]:
        lines.append("  ".join(f"{w[c]!s:>{len(c)}}" for c in cols))
    for layout, size in result["index_bytes_per_row"].items():
        lines.append(f"index bytes per row at the end, {layout}: {size}")
    return "\n".join(lines)
