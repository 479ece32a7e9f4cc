"""The chart's rollup read narrows each tier by the primary key (gpu_id, width_s, bucket) and
returns exactly the rows the old `ts` filter over all of the GPU's rollups returned."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, insert, select, text

from trainguard.backend.models import Gpu, Node, Sample, SampleRollup
from trainguard.backend.retention import ROLLUP_READ_SQL, Retention, RetentionPolicy, rollup_rows

HOUR = 3600.0
DAY = 86400.0
NOW = 1_790_000_000.0  # a 900 s boundary
# Raw 2 h, 60 s rollups for 12 h, 900 s rollups for 30 days: three tiers in 3 days of data.
POLICY = RetentionPolicy(2 * HOUR, 12 * HOUR, 30 * DAY)

# The read before it used the key: every rollup of the GPU, filtered on ts.
_FULL_SCAN = (
    "SELECT ts, n, util, mem_util, mem_used_mib, temp_c, power_w, sm_clock_mhz, "
    "mem_clock_mhz, ecc_sbe_volatile, ecc_dbe_volatile, remapped_uncorrectable, "
    "pcie_replay FROM sample_rollups WHERE gpu_id = :g AND ts >= :s AND ts <= :u ORDER BY ts"
)


def _samples(gpu_ids: list[int], start: float, end: float, rnd: random.Random) -> list[dict]:
    """A sample every ~30 s per GPU, at jittered times so the rollups' mean times fall
    anywhere inside their windows (and some right at a window's edge)."""
    out = []
    t = start
    while t < end:
        for g in gpu_ids:
            ts = t + rnd.choice((0.0, 0.0, rnd.uniform(0, 30), 29.999))
            out.append({"gpu_id": g, "ts": ts, "util": rnd.uniform(0, 100), "pcie_replay": 1})
        t += 30.0
    return out


@pytest.fixture
def three_tiers(db_url: str) -> Iterator[tuple[Engine, list[int]]]:
    """Two GPUs, 3 days of samples ending at NOW, pruned twice (late samples merged into
    windows already folded in between): raw, 60 s and 900 s rows for both."""
    engine = create_engine(db_url)
    rnd = random.Random(7)
    with engine.begin() as conn:
        conn.execute(insert(Node), [{"name": "n1", "first_seen": NOW, "last_seen": NOW}])
        node_id = conn.execute(select(Node.id)).scalar_one()
        conn.execute(
            insert(Gpu), [{"node_id": node_id, "uuid": f"GPU-n1-{i}", "index": i} for i in (0, 1)]
        )
        gpu_ids = list(conn.execute(select(Gpu.id).order_by(Gpu.id)).scalars())
        conn.execute(insert(Sample), _samples(gpu_ids, NOW - 3 * DAY, NOW - DAY, rnd))
    Retention(engine, POLICY).run_once(NOW - DAY)
    with engine.begin() as conn:
        late = _samples(gpu_ids, NOW - 2 * DAY, NOW - 2 * DAY + HOUR, rnd)
        conn.execute(insert(Sample), late + _samples(gpu_ids, NOW - DAY, NOW, rnd))
    Retention(engine, POLICY).run_once(NOW)
    with engine.connect() as conn:
        tiers = dict(
            conn.execute(
                select(SampleRollup.width_s, func.count()).group_by(SampleRollup.width_s)
            ).all()
        )
        raw = conn.execute(select(func.count()).select_from(Sample)).scalar_one()
    assert raw > 0 and tiers[60] > 0 and tiers[900] > 0
    yield engine, gpu_ids
    engine.dispose()


def _windows(conn: Any, gpu_id: int, rnd: random.Random) -> list[tuple[float, float]]:
    """The chart's windows ending now, random ones, and ones whose ends sit exactly on
    rollup times and window starts, where an off-by-one in the bucket range would show."""
    out = [(NOW - w, NOW) for w in (HOUR, 6 * HOUR, DAY, 3 * DAY, 30 * DAY)]
    out += [
        (s, s + rnd.uniform(0, 2 * DAY))
        for s in (rnd.uniform(NOW - 4 * DAY, NOW) for _ in range(100))
    ]
    edges = conn.execute(
        text("SELECT ts, bucket, width_s FROM sample_rollups WHERE gpu_id = :g"), {"g": gpu_id}
    ).all()
    for ts, bucket, width in rnd.sample(edges, 60):
        out += [(ts, ts), (ts, ts + width), (ts - width, ts), (bucket, bucket + width)]
        out += [(bucket - width, bucket), (bucket + width, bucket + 2 * width)]
    return out


def test_rollup_rows_returns_what_the_full_scan_returned(
    three_tiers: tuple[Engine, list[int]],
) -> None:
    engine, gpu_ids = three_tiers
    rnd = random.Random(11)
    nonempty = 0
    with engine.connect() as conn:
        for g in gpu_ids:
            for since, until in _windows(conn, g, rnd):
                params = {"g": g, "s": since, "u": until}
                want = [dict(r) for r in conn.execute(text(_FULL_SCAN), params).mappings()]
                got = rollup_rows(conn, g, since, until)
                key = lambda r: (r["ts"], r["n"])  # noqa: E731 - a sort key, used twice
                assert sorted(got, key=key) == sorted(want, key=key), (g, since, until)
                nonempty += bool(want)
    assert nonempty > 300  # the comparison saw rows, not only empty windows


def _plan(conn: Any, gpu_id: int, since: float, until: float) -> str:
    prefix = "EXPLAIN " if conn.dialect.name == "postgresql" else "EXPLAIN QUERY PLAN "
    rows = conn.execute(text(prefix + ROLLUP_READ_SQL), {"g": gpu_id, "s": since, "u": until})
    # PostgreSQL answers one column, QUERY PLAN; SQLite (id, parent, notused, detail).
    return "\n".join(str(r[-1]) for r in rows)


def test_rollup_read_is_a_key_range_per_tier(three_tiers: tuple[Engine, list[int]]) -> None:
    engine, gpu_ids = three_tiers
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            # The tables are small here, so ask for the plan an index can give: with the old
            # `ts` filter its only index condition was gpu_id.
            conn.execute(text("SET enable_seqscan = off"))
        plan = _plan(conn, gpu_ids[0], NOW - HOUR, NOW)
    if engine.dialect.name == "postgresql":
        conds = [line for line in plan.splitlines() if "Index Cond" in line]
        assert conds and "Seq Scan" not in plan, plan
        assert all("width_s" in c and "bucket >=" in c and "bucket <=" in c for c in conds), plan
    else:
        searches = [line for line in plan.splitlines() if "sample_rollups" in line]
        assert searches and all("SEARCH" in s for s in searches), plan
        assert all("width_s=? AND bucket>? AND bucket<?" in s for s in searches), plan
