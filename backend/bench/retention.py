"""`trainguard bench retention`: steady-state database size of a 16,384-GPU cluster over 30
simulated days, and the latency of the node page's reads over it.

What a backend keeps is bounded by retention (backend/retention.py): the raw window, then
60 s rollups, then 900 s rollups. Every tier holds the same rows per GPU, so size is linear
in GPUs and a measured subset extrapolates: `gpus` GPUs (8 per node) write synthetic
samples over `days` simulated days that END NOW (compressed time: written as fast as the
database takes them, in time order, `chunk_s` of simulated time at a time, binary COPY on
PostgreSQL and executemany on SQLite like the ingest writer), and the real pruner
(`Retention.run_once(now=chunk end)`, the production SQL) runs after every chunk, so what
remains is what production keeps. Samples are 1 s apart over the last two raw windows
(the raw table turns over once at full rate) and 60 s apart before: those are folded into
rollups, and a rollup row has the same size whatever the number of samples it folds.
PostgreSQL's autovacuum is emulated (the test server runs with it off): a table is
vacuumed and analyzed when its dead or inserted rows pass autovacuum's default triggers,
so the sizes carry the bloat production carries.

Reported per tier: rows, bytes (table + indexes) measured, bytes per GPU, and the
extrapolation to `cluster_gpus`; the two rollup tiers share one table, whose bytes are
split by row count (the rows have one width). Then a real `trainguard server` answers the
node page's reads over HTTP (GET /nodes/<n>, /nodes/<n>/gpus, /gpus/<uuid>/samples) for
windows that reach each tier, with `until` = the simulated end. Last, the tables are
compacted (VACUUM FULL; SQLite VACUUM) and measured again: the floor under the bloat.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, insert, text

from trainguard.backend.retention import Retention, RetentionPolicy

TOKEN = "bench-token-0123456789abcdef"
GPUS_PER_NODE = 8
DAY = 86400.0
# Chart windows (label, seconds); the node page asks for 300 points.
WINDOWS = (("1h", 3600.0), ("6h", 6 * 3600.0), ("3d", 3 * DAY), ("30d", 30 * DAY))
_CYCLE = 997  # distinct synthetic readings per GPU, cycled


class BenchError(Exception):
    """A bench that cannot run as asked (one line for the CLI)."""


def _readings(seed: int) -> list[tuple[Any, ...]]:
    """Sample-shaped readings in SAMPLE_READINGS order, every column set (the widest row)."""
    rnd = random.Random(seed)
    return [
        (
            rnd.uniform(80, 100),  # util
            rnd.uniform(30, 50),  # mem_util
            rnd.uniform(6e4, 7e4),  # mem_used_mib
            81559.0,  # mem_total_mib
            rnd.uniform(55, 75),  # temp_c
            rnd.uniform(60, 80),  # mem_temp_c
            rnd.uniform(550, 700),  # power_w
            rnd.uniform(1e9, 2e9),  # energy_mj
            1980.0,  # sm_clock_mhz
            2619.0,  # mem_clock_mhz
            0,  # clock_event_reasons
            0,  # ecc_sbe_volatile
            0,  # ecc_dbe_volatile
            0,  # remapped_correctable
            0,  # remapped_uncorrectable
            False,  # remap_pending
            False,  # remap_failure
            rnd.randrange(3),  # pcie_replay
        )
        for _ in range(_CYCLE)
    ]


def _write(engine: Engine, rows: list[tuple[Any, ...]]) -> None:
    from trainguard.backend.ingest.writer import _PG_TYPES, SAMPLE_COLUMNS

    cols = ", ".join(SAMPLE_COLUMNS)
    with engine.begin() as conn:
        dbapi: Any = conn.connection.driver_connection
        if engine.dialect.name == "postgresql":
            with (
                dbapi.cursor() as cur,
                cur.copy(f"COPY samples ({cols}) FROM STDIN (FORMAT BINARY)") as copy,
            ):
                copy.set_types(_PG_TYPES)
                for r in rows:
                    copy.write_row(r)
        else:
            cur = dbapi.cursor()
            marks = ", ".join("?" * len(SAMPLE_COLUMNS))
            cur.executemany(f"INSERT INTO samples ({cols}) VALUES ({marks})", rows)
            cur.close()


class _Autovacuum:
    """PostgreSQL autovacuum's default triggers, applied after each pruner run: VACUUM
    ANALYZE when dead rows > 50 + 20 % of reltuples or rows inserted since the last vacuum
    > 1000 + 20 %; ANALYZE when rows changed since the last analyze > 50 + 10 %."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.state = {t: {"dead": 0, "ins": 0, "chg": 0} for t in ("samples", "sample_rollups")}
        self.vacuums = 0

    def note(self, table: str, inserted: int, deleted: int) -> None:
        s = self.state[table]
        s["dead"] += deleted
        s["ins"] += inserted
        s["chg"] += inserted + deleted

    def maybe_run(self) -> None:
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table, s in self.state.items():
                rel = conn.execute(
                    text("SELECT reltuples FROM pg_class WHERE relname = :t"), {"t": table}
                ).scalar_one()
                rel = max(float(rel), 0.0)
                if s["dead"] > 50 + 0.2 * rel or s["ins"] > 1000 + 0.2 * rel:
                    conn.execute(text(f"VACUUM (ANALYZE) {table}"))
                    self.vacuums += 1
                    s.update(dead=0, ins=0, chg=0)
                elif s["chg"] > 50 + 0.1 * rel:
                    conn.execute(text(f"ANALYZE {table}"))
                    s["chg"] = 0


def _stamps(
    start: float, end: float, dense_from: float, period: float, old_period: float
) -> Iterator[float]:
    """Sample times: every `old_period` s before `dense_from`, every `period` s after."""
    i = 0
    while (t := start + i * old_period) < min(dense_from, end):
        yield t
        i += 1
    first = max(start, dense_from)
    i = 0
    while (t := first + i * period) < end:
        yield t
        i += 1


def _simulate(
    engine: Engine,
    gpu_ids: list[int],
    start: float,
    end: float,
    stamps: tuple[float, float, float],
    chunk_s: float,
    policy: RetentionPolicy,
) -> dict[str, Any]:
    """Samples from `start` to `end` in time order, the pruner after every chunk;
    `stamps` = (dense_from, period, old_period), see _stamps."""
    dense_from, period, old_period = stamps
    retention = Retention(engine, policy)
    vacuum = _Autovacuum(engine) if engine.dialect.name == "postgresql" else None
    cycles = {g: _readings(g) for g in gpu_ids}
    times = _stamps(start, end, dense_from, period, old_period)
    ts = next(times, end)
    written = 0
    rollups = 0
    k = 0
    t0 = time.perf_counter()
    chunk_start = start
    while chunk_start < end:
        chunk_end = min(chunk_start + chunk_s, end)
        rows: list[tuple[Any, ...]] = []
        while ts < chunk_end:
            rows.extend((g, ts, *cycles[g][k % _CYCLE]) for g in gpu_ids)
            k += 1
            ts = next(times, end)
        _write(engine, rows)
        written += len(rows)
        pruned = retention.run_once(now=chunk_end)
        if vacuum is not None:
            with engine.connect() as conn:
                now_rollups = conn.execute(text("SELECT COUNT(*) FROM sample_rollups")).scalar_one()
            gone = pruned["rollups_60_folded"] + pruned["rollups_900_dropped"]
            vacuum.note("samples", len(rows), pruned["raw_folded"])
            vacuum.note("sample_rollups", now_rollups - rollups + gone, gone)
            rollups = now_rollups
            vacuum.maybe_run()
        chunk_start = chunk_end
    return {
        "written_samples": written,
        "write_and_prune_s": round(time.perf_counter() - t0, 1),
        "vacuums": vacuum.vacuums if vacuum else None,
    }


def _sizes(engine: Engine) -> dict[str, int]:
    """Bytes of each table and of its indexes, and of the whole database."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            out: dict[str, int] = {}
            for t in ("samples", "sample_rollups"):
                heap, idx = conn.execute(
                    text("SELECT pg_table_size(:t), pg_indexes_size(:t)"), {"t": t}
                ).one()
                out[f"{t}_table"], out[f"{t}_indexes"] = int(heap), int(idx)
            out["database"] = int(
                conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
            )
            out["free"] = 0
            return out
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        out = {f"{t}_{k}": 0 for t in ("samples", "sample_rollups") for k in ("table", "indexes")}
        for tbl, kind, size in conn.exec_driver_sql(
            "SELECT s.tbl_name, s.type, SUM(d.pgsize) FROM dbstat d "
            "JOIN sqlite_schema s ON s.name = d.name GROUP BY s.tbl_name, s.type"
        ):
            key = f"{tbl}_{'table' if kind == 'table' else 'indexes'}"
            if key in out:
                out[key] = int(size)
        page = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
        out["database"] = page * conn.exec_driver_sql("PRAGMA page_count").scalar_one()
        out["free"] = page * conn.exec_driver_sql("PRAGMA freelist_count").scalar_one()
        return out


def _tiers(sizes: dict[str, int], rows: dict[str, int], gpus: int, cluster: int) -> list[dict]:
    raw = sizes["samples_table"] + sizes["samples_indexes"]
    roll = sizes["sample_rollups_table"] + sizes["sample_rollups_indexes"]
    roll_rows = rows["60s"] + rows["900s"]
    split = {
        "raw": raw,
        "60s": round(roll * rows["60s"] / roll_rows) if roll_rows else 0,
        "900s": round(roll * rows["900s"] / roll_rows) if roll_rows else 0,
    }
    out = []
    for tier, size in split.items():
        out.append(
            {
                "tier": tier,
                "rows": rows[tier],
                "bytes": size,
                "bytes_per_row": round(size / rows[tier], 1) if rows[tier] else None,
                "bytes_per_gpu": round(size / gpus),
                "cluster_bytes": round(size / gpus * cluster),
            }
        )
    return out


def _seed_inventory(engine: Engine, gpus: int, now: float) -> tuple[list[str], list[str]]:
    from trainguard.backend.models import Gpu, Node

    nodes = [f"ret-{i:05d}" for i in range(math.ceil(gpus / GPUS_PER_NODE))]
    with engine.begin() as conn:
        with_samples = conn.execute(
            text("SELECT (SELECT COUNT(*) FROM samples) + (SELECT COUNT(*) FROM sample_rollups)")
        ).scalar_one()
        if with_samples:
            raise BenchError("the database already holds samples; the bench needs an empty one")
        conn.execute(
            insert(Node),
            [{"name": n, "simulated": True, "first_seen": now, "last_seen": now} for n in nodes],
        )
        ids: dict[str, int] = dict(
            conn.execute(text("SELECT name, id FROM nodes WHERE name LIKE 'ret-%'")).all()
        )
        uuids = [f"GPU-ret-{i // GPUS_PER_NODE:05d}-{i % GPUS_PER_NODE}" for i in range(gpus)]
        conn.execute(
            insert(Gpu),
            [
                {
                    "node_id": ids[nodes[i // GPUS_PER_NODE]],
                    "uuid": u,
                    "index": i % GPUS_PER_NODE,
                    "name": "NVIDIA H100 80GB HBM3 (simulated)",
                    "memory_total_mib": 81559.0,
                    "power_limit_w": 700.0,
                    "simulated": True,
                }
                for i, u in enumerate(uuids)
            ],
        )
    return nodes, uuids


def _latency(
    base: str, nodes: list[str], uuids: list[str], end: float, requests: int, points: int
) -> list[dict[str, Any]]:
    import httpx

    reads: list[tuple[str, str, dict[str, Any] | None]] = [
        ("node", "/api/v1/nodes/{node}", None),
        ("node_gpus", "/api/v1/nodes/{node}/gpus", None),
    ]
    for label, w in WINDOWS:
        q = {"since": end - w, "until": end, "points": points}
        reads.append((f"gpu_samples_{label}", "/api/v1/gpus/{uuid}/samples", q))
    out = []
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=base, headers=auth, timeout=120) as client:
        for name, path, params in reads:
            lat: list[float] = []
            got = 0
            for i in range(requests + 1):  # the first is a warm-up, not counted
                url = path.format(node=nodes[i % len(nodes)], uuid=uuids[i % len(uuids)])
                t0 = time.perf_counter()
                resp = client.get(url, params=params)
                dt = time.perf_counter() - t0
                if resp.status_code != 200:
                    raise BenchError(f"GET {url} answered {resp.status_code}: {resp.text[:200]}")
                if i:
                    lat.append(dt)
                if params:
                    got = len(resp.json()["columns"]["ts"])
            lat.sort()
            out.append(
                {
                    "read": name,
                    "requests": len(lat),
                    "p50_ms": round(1000 * statistics.median(lat), 1),
                    "p99_ms": round(1000 * lat[math.ceil(0.99 * len(lat)) - 1], 1),
                    "points": got if params else None,
                }
            )
    return out


def run(
    gpus: int = 8,
    days: float = 30.0,
    period: float = 1.0,
    old_period: float = 60.0,
    dense_s: float | None = None,
    chunk_s: float = 3600.0,
    cluster_gpus: int = 16384,
    requests: int = 30,
    points: int = 300,
    policy: RetentionPolicy | None = None,
    database_url: str | None = None,
    data_dir: Path = Path("data/bench-retention"),
    port: int = 8317,
    json_out: Path | None = None,
) -> dict[str, Any]:
    """Simulate `days` ending now for `gpus` GPUs under `policy`, measure, then time the
    reads. Samples are `period` s apart over the last `dense_s` (default: twice the raw
    window, so the raw table turns over at full rate before it is measured) and
    `old_period` s apart before (they are folded into rollups, whose rows have the same
    size whatever the number of samples they fold)."""
    from trainguard.backend import db
    from trainguard.backend.bench.common import fresh_database
    from trainguard.backend.demo import start_server

    policy = policy or RetentionPolicy()
    dense_s = 2 * policy.raw_retention_s if dense_s is None else dense_s
    if old_period < period:
        raise BenchError("--old-period must be at least --period")
    url = fresh_database(data_dir, database_url, "retention.db")
    engine = db.make_engine(url)
    # The simulated days end now, so the server's clock and the data agree.
    end = float(math.floor(time.time()))
    start = end - days * DAY
    try:
        nodes, uuids = _seed_inventory(engine, gpus, end)
        with engine.connect() as conn:
            gpu_ids = [
                gid
                for (gid,) in conn.execute(
                    text("SELECT id FROM gpus WHERE uuid LIKE 'GPU-ret-%' ORDER BY id")
                )
            ]
        stamps = (end - dense_s, period, old_period)
        sim = _simulate(engine, gpu_ids, start, end, stamps, chunk_s, policy)
        with engine.connect() as conn:
            raw_rows = conn.execute(text("SELECT COUNT(*) FROM samples")).scalar_one()
            by_width: dict[int, int] = dict(
                conn.execute(
                    text("SELECT width_s, COUNT(*) FROM sample_rollups GROUP BY width_s")
                ).all()
            )
            oldest_raw = conn.execute(text("SELECT MIN(ts) FROM samples")).scalar_one()
        rows = {"raw": raw_rows, "60s": by_width.get(60, 0), "900s": by_width.get(900, 0)}
        steady = _sizes(engine)
        latency: list[dict[str, Any]] = []
        if requests:
            env = {
                **os.environ,
                "TRAINGUARD_ADMIN_TOKEN": TOKEN,
                "TRAINGUARD_DATABASE_URL": url,
                "TRAINGUARD_DATA_DIR": str(data_dir),
                "TRAINGUARD_RAW_RETENTION_S": str(policy.raw_retention_s),
                "TRAINGUARD_ROLLUP_60_RETENTION_S": str(policy.rollup_60_retention_s),
                "TRAINGUARD_ROLLUP_900_RETENTION_S": str(policy.rollup_900_retention_s),
                # The bench ran the pruner up to the simulated end: the reads see that state.
                "TRAINGUARD_RETENTION_INTERVAL_S": "86400",
            }
            server = start_server(port, env)
            try:
                latency = _latency(f"http://127.0.0.1:{port}", nodes, uuids, end, requests, points)
            finally:
                server.terminate()
                server.wait(30)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            if engine.dialect.name == "postgresql":
                conn.execute(text("VACUUM FULL samples, sample_rollups"))
            else:
                conn.exec_driver_sql("VACUUM")
        compact = _sizes(engine)
    finally:
        engine.dispose()
    result: dict[str, Any] = {
        "database": engine.dialect.name,
        "gpus": gpus,
        "cluster_gpus": cluster_gpus,
        "days": days,
        "period_s": period,
        "old_period_s": old_period,
        "dense_s": min(dense_s, days * DAY),
        "chunk_s": chunk_s,
        "policy": {
            "raw_s": policy.raw_retention_s,
            "rollup_60_s": policy.rollup_60_retention_s,
            "rollup_900_s": policy.rollup_900_retention_s,
        },
        "simulated_start": start,
        "simulated_end": end,
        "oldest_raw_ts": oldest_raw,
        **sim,
        "sizes_steady": steady,
        "sizes_compact": compact,
        "tiers_steady": _tiers(steady, rows, gpus, cluster_gpus),
        "tiers_compact": _tiers(compact, rows, gpus, cluster_gpus),
        "latency": latency,
    }
    if json_out:
        json_out.write_text(json.dumps(result, indent=2))
    return result


def _human(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n / 2**10:,.1f} KiB"


def table(result: dict[str, Any]) -> str:
    g, c = result["gpus"], result["cluster_gpus"]
    out = [
        f"{result['database']}: {g} GPUs measured, {result['days']:g} simulated days (a "
        f"sample every {result['period_s']:g} s over the last {result['dense_s'] / 3600:g} h, "
        f"every {result['old_period_s']:g} s before), {result['written_samples']:,} samples "
        f"written and pruned in {result['write_and_prune_s']} s",
        "",
        f"| tier | rows (measured) | bytes measured | bytes/row | per GPU "
        f"| {c:,} GPUs (extrapolated) | compacted, {c:,} GPUs (extrapolated) |",
        "|---|---|---|---|---|---|---|",
    ]
    for s, k in zip(result["tiers_steady"], result["tiers_compact"], strict=True):
        out.append(
            f"| {s['tier']} | {s['rows']:,} | {_human(s['bytes'])} | {s['bytes_per_row']} "
            f"| {_human(s['bytes_per_gpu'])} | {_human(s['cluster_bytes'])} "
            f"| {_human(k['cluster_bytes'])} |"
        )
    steady = sum(t["cluster_bytes"] for t in result["tiers_steady"])
    compact = sum(t["cluster_bytes"] for t in result["tiers_compact"])
    measured = sum(t["bytes"] for t in result["tiers_steady"])
    out.append(f"| total | | {_human(measured)} | | | {_human(steady)} | {_human(compact)} |")
    sz = result["sizes_steady"]
    out.append(
        f"\nwhole database (measured): {_human(sz['database'])}, free pages {_human(sz['free'])}"
    )
    if result["latency"]:
        out += ["", "| read | requests | p50 ms | p99 ms | points |", "|---|---|---|---|---|"]
        for r in result["latency"]:
            out.append(
                f"| {r['read']} | {r['requests']} | {r['p50_ms']} | {r['p99_ms']} "
                f"| {r['points'] if r['points'] is not None else '-'} |"
            )
    return "\n".join(out)
