"""Retention: raw samples for a bounded window, rollups beyond it, pruned in the background.

Every `interval` the pruner folds raw samples older than `raw_retention_s` into 60 s
rollups and deletes them, folds 60 s rollups older than `rollup_60_retention_s` into
900 s rollups, and deletes 900 s rollups older than `rollup_900_retention_s`. Windows are
aligned to their width, so a window is folded whole; a late sample (a spool replayed after
its window was folded) is merged into the existing rollup by weighted mean. On PostgreSQL
one replica at a time prunes (a transaction-level advisory lock); the others skip.
Long history belongs in Prometheus (`/metrics`); this keeps the charts' last weeks cheap.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text

from trainguard.backend.models import sample_bucket

log = logging.getLogger(__name__)

_LOCK_KEY = 0x7452_4554  # "tRET"
# (column, how to fold it): mean weighted by sample count, or max.
_MEAN = ("util", "mem_util", "mem_used_mib", "temp_c", "power_w", "sm_clock_mhz", "mem_clock_mhz")
_MAX = ("ecc_sbe_volatile", "ecc_dbe_volatile", "remapped_uncorrectable", "pcie_replay")


@dataclass
class RetentionPolicy:
    raw_retention_s: float = 6 * 3600
    rollup_60_retention_s: float = 7 * 86400
    rollup_900_retention_s: float = 90 * 86400


def _window(dialect: str, col: str, width: int) -> str:
    # floor(col / width) * width; SQLite's CAST truncates, which is floor for t >= 0.
    if dialect == "postgresql":
        return f"floor({col} / {width}) * {width}"
    return f"CAST({col} / {width} AS INTEGER) * {width}"


def _upsert_tail() -> str:
    """ON CONFLICT clause merging a late window into an existing rollup."""
    sets = [
        "n = sample_rollups.n + excluded.n",
        "ts = (sample_rollups.ts * sample_rollups.n + excluded.ts * excluded.n)"
        " / (sample_rollups.n + excluded.n)",
    ]
    for c in _MEAN:
        sets.append(
            f"{c} = COALESCE((sample_rollups.{c} * sample_rollups.n + excluded.{c} * excluded.n)"
            f" / (sample_rollups.n + excluded.n), sample_rollups.{c}, excluded.{c})"
        )
    for c in (*_MAX, "util_max", "temp_max"):
        sets.append(
            f"{c} = CASE WHEN excluded.{c} > sample_rollups.{c} OR sample_rollups.{c}"
            f" IS NULL THEN excluded.{c} ELSE sample_rollups.{c} END"
        )
    return "ON CONFLICT (gpu_id, width_s, bucket) DO UPDATE SET " + ", ".join(sets)


_COLS = ("gpu_id", "width_s", "bucket", "n", "ts", *_MEAN, "util_max", "temp_max", *_MAX)


# Raw samples older than the cutoff: the oldest buckets, a prefix of ix_samples_bucket_gpu
# (migrations 0011, 0012); ts cuts the last of them, which the cutoff may split. The range
# is closed on both ends (from the oldest bucket there is): PostgreSQL's planner, without
# statistics for `samples` (a fresh table, autovacuum off), estimated a third of the table
# for `bucket <= :cutoff_bucket` and read all of it in parallel (at 131,072 GPUs, 0.7 GB
# at the first run, 1.8 GB two minutes in); a closed range is estimated small and read
# through the index.
_RAW_BEFORE_CUTOFF = (
    "samples WHERE bucket BETWEEN :oldest_bucket AND :cutoff_bucket AND ts < :cutoff"
)
# The oldest raw sample's bucket and the oldest batch key's time, each one descent of
# its index: min() over an index's leading column is read from the index's first entry.
_OLDEST_BUCKET = "SELECT min(bucket) FROM samples"
_OLDEST_BATCH_KEY = "SELECT min(received_at) FROM ingest_batches"


def _fold_raw_sql(dialect: str) -> str:
    w = _window(dialect, "ts", 60)
    means = ", ".join(f"AVG({c})" for c in _MEAN)
    maxes = ", ".join(f"MAX({c})" for c in _MAX)
    return (
        f"INSERT INTO sample_rollups ({', '.join(_COLS)}) "
        f"SELECT gpu_id, 60, {w}, COUNT(*), AVG(ts), {means}, MAX(util), MAX(temp_c), {maxes} "
        f"FROM {_RAW_BEFORE_CUTOFF} GROUP BY gpu_id, {w} " + _upsert_tail()
    )


def _fold_60_sql(dialect: str) -> str:
    w = _window(dialect, "bucket", 900)
    means = ", ".join(
        f"SUM({c} * n) / NULLIF(SUM(CASE WHEN {c} IS NULL THEN 0 ELSE n END), 0)" for c in _MEAN
    )
    maxes = ", ".join(f"MAX({c})" for c in _MAX)
    return (
        f"INSERT INTO sample_rollups ({', '.join(_COLS)}) "
        f"SELECT gpu_id, 900, {w}, SUM(n), SUM(ts * n) / SUM(n), {means}, MAX(util_max), "
        f"MAX(temp_max), {maxes} FROM sample_rollups WHERE width_s = 60 AND bucket < :cutoff "
        f"GROUP BY gpu_id, {w} " + _upsert_tail()
    )


class Retention:
    def __init__(self, engine: Engine, policy: RetentionPolicy) -> None:
        self.engine = engine
        self.policy = policy
        self.dialect = engine.dialect.name
        self.last: dict[str, Any] = {}

    def run_once(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        p = self.policy
        # Cut on window boundaries so every folded window is whole.
        raw_cut = (now - p.raw_retention_s) // 60 * 60
        cut_60 = (now - p.rollup_60_retention_s) // 900 * 900
        cut_900 = now - p.rollup_900_retention_s
        with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                got = conn.execute(
                    text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _LOCK_KEY}
                ).scalar()
                if not got:
                    return {"skipped": "another replica is pruning"}
            # Nothing older than the cutoff (the first raw_retention_s of a deployment, a
            # run just after the last): no statement reads the tables at all. Every minute
            # at the goal rate each such run cost a scan of every raw sample, and the
            # ingest p99 of the 10 s around it went from hundreds of ms to 1.5-3.5 s
            # (docs/benchmarks.md, "The pruner's first run").
            raw = keys = 0
            cutoff_bucket = sample_bucket(raw_cut)
            oldest = conn.execute(text(_OLDEST_BUCKET)).scalar()
            if oldest is not None and oldest <= cutoff_bucket:
                before = {
                    "cutoff": raw_cut,
                    "cutoff_bucket": cutoff_bucket,
                    "oldest_bucket": oldest,
                }
                conn.execute(text(_fold_raw_sql(self.dialect)), before)
                raw = conn.execute(text(f"DELETE FROM {_RAW_BEFORE_CUTOFF}"), before).rowcount
            # A batch's key dedups a replay of it while its samples are raw; a replay
            # older than that would only add to a window already folded.
            oldest_key = conn.execute(text(_OLDEST_BATCH_KEY)).scalar()
            if oldest_key is not None and oldest_key < raw_cut:
                keys = conn.execute(
                    text(
                        "DELETE FROM ingest_batches WHERE received_at >= :oldest "
                        "AND received_at < :c"
                    ),
                    {"oldest": oldest_key, "c": raw_cut},
                ).rowcount
            conn.execute(text(_fold_60_sql(self.dialect)), {"cutoff": cut_60})
            r60 = conn.execute(
                text("DELETE FROM sample_rollups WHERE width_s = 60 AND bucket < :c"),
                {"c": cut_60},
            ).rowcount
            r900 = conn.execute(
                text("DELETE FROM sample_rollups WHERE width_s = 900 AND bucket < :c"),
                {"c": cut_900},
            ).rowcount
        self.last = {
            "at": now,
            "raw_folded": raw,
            "batch_keys_dropped": keys,
            "rollups_60_folded": r60,
            "rollups_900_dropped": r900,
        }
        if raw or keys or r60 or r900:
            log.info("retention: %s", self.last)
        return self.last


# Rollup widths, finest first. A rollup's `ts` is the mean time of the samples it folds, so
# it lies in its window [bucket, bucket + width_s] (up to float rounding, see _rollup_read_sql).
ROLLUP_WIDTHS = (60, 900)
_SLACK_S = 1.0


def _rollup_read_sql() -> str:
    """A rollup with `ts` in [:s, :u] has its `bucket` in [:s - width_s, :u], so each tier is
    read as a range of the primary key (gpu_id, width_s, bucket), not as every rollup of the
    GPU filtered on `ts`. A second of slack covers the rounding of floor(ts / width) and of
    the means; the `ts` test decides which rows come back."""
    tiers = " OR ".join(
        f"(width_s = {w} AND bucket >= :s - {w + _SLACK_S} AND bucket <= :u + {_SLACK_S})"
        for w in ROLLUP_WIDTHS
    )
    return (
        "SELECT ts, n, util, mem_util, mem_used_mib, temp_c, power_w, sm_clock_mhz, "
        "mem_clock_mhz, ecc_sbe_volatile, ecc_dbe_volatile, remapped_uncorrectable, "
        f"pcie_replay FROM sample_rollups WHERE gpu_id = :g AND ({tiers}) "
        "AND ts >= :s AND ts <= :u ORDER BY ts"
    )


ROLLUP_READ_SQL = _rollup_read_sql()


def rollup_rows(conn: Any, gpu_id: int, since: float, until: float) -> list[dict[str, Any]]:
    """Rollups of a GPU in a time range, as sample-shaped rows (for the chart reads)."""
    rows = conn.execute(text(ROLLUP_READ_SQL), {"g": gpu_id, "s": since, "u": until}).mappings()
    return [dict(r) for r in rows]
