"""`trainguard bench retention` on a tiny cluster: what it leaves is what the pruner keeps,
its sizes add up, and the chart reads answer over HTTP from a real server."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from tests.support import free_port
from trainguard.agent.cli import app
from trainguard.backend.bench.retention import run
from trainguard.backend.retention import RetentionPolicy

HOUR = 3600.0
PERIOD = 20.0  # one sample per 20 s: three per 60 s window


def _expected(end: float, days: float, policy: RetentionPolicy) -> dict[str, int]:
    """Rows per GPU the pruner keeps, from its cut rules (backend/retention.py)."""
    start = end - days * 86400
    stamps = [start + i * PERIOD for i in range(int(days * 86400 / PERIOD))]
    raw_cut = (end - policy.raw_retention_s) // 60 * 60
    cut_60 = (end - policy.rollup_60_retention_s) // 900 * 900
    cut_900 = end - policy.rollup_900_retention_s
    windows_900 = {t // 900 * 900 for t in stamps if t < cut_60}
    return {
        "raw": sum(1 for t in stamps if t >= raw_cut),
        "60s": len({t // 60 for t in stamps if cut_60 <= t < raw_cut}),
        "900s": sum(1 for b in windows_900 if b >= cut_900),
    }


def test_the_bench_keeps_what_retention_keeps_and_sizes_add_up(db_url: str, tmp_path: Path) -> None:
    # Half a day of 2 GPUs: 1 h raw, 60 s rollups for 4 h, 900 s rollups for 8 h, so every
    # tier is filled and the oldest 900 s rollups are dropped.
    policy = RetentionPolicy(HOUR, 4 * HOUR, 8 * HOUR)
    result = run(
        gpus=2,
        days=0.5,
        period=PERIOD,
        old_period=PERIOD,
        cluster_gpus=1000,
        requests=2,
        policy=policy,
        database_url=db_url,
        data_dir=tmp_path,
        port=free_port(),
    )
    end = result["simulated_end"]
    want = _expected(end, 0.5, policy)
    # Cuts fall on 60 s and 900 s boundaries, so each tier holds up to one window more.
    assert 180 <= want["raw"] <= 183 and 180 <= want["60s"] <= 195 and 0 < want["900s"] < 18

    engine = create_engine(db_url)
    with engine.connect() as conn:
        per_gpu = conn.execute(
            text("SELECT gpu_id, COUNT(*), MIN(ts) FROM samples GROUP BY gpu_id")
        ).all()
        rollups: dict[int, int] = dict(
            conn.execute(
                text("SELECT width_s, COUNT(*) FROM sample_rollups GROUP BY width_s")
            ).all()
        )
        n_60 = conn.execute(text("SELECT SUM(n) FROM sample_rollups WHERE width_s = 60")).scalar()
    engine.dispose()
    assert len(per_gpu) == 2
    for _, count, oldest in per_gpu:
        assert count == want["raw"]
        assert oldest >= end - policy.raw_retention_s - 60  # older raw rows are gone
    assert rollups == {60: 2 * want["60s"], 900: 2 * want["900s"]}
    assert n_60 == 2 * want["60s"] * 3  # every folded sample counted once

    tiers = {t["tier"]: t for t in result["tiers_steady"]}
    assert {k: t["rows"] for k, t in tiers.items()} == {k: 2 * v for k, v in want.items()}
    sizes = result["sizes_steady"]
    assert tiers["raw"]["bytes"] == sizes["samples_table"] + sizes["samples_indexes"]
    rollup_bytes = sizes["sample_rollups_table"] + sizes["sample_rollups_indexes"]
    assert abs(tiers["60s"]["bytes"] + tiers["900s"]["bytes"] - rollup_bytes) <= 1
    for t in result["tiers_steady"] + result["tiers_compact"]:
        assert t["bytes"] > 0
        assert t["cluster_bytes"] == round(t["bytes"] / 2 * 1000)
    assert sizes["database"] >= tiers["raw"]["bytes"] + rollup_bytes

    reads = {r["read"]: r for r in result["latency"]}
    assert set(reads) == {
        "node",
        "node_gpus",
        "gpu_samples_1h",
        "gpu_samples_6h",
        "gpu_samples_3d",
        "gpu_samples_30d",
    }
    for r in reads.values():
        assert r["requests"] == 2 and 0 < r["p50_ms"] <= r["p99_ms"]
    # 180 raw samples in 300 buckets of 12 s, each alone in its bucket; the empty buckets
    # between them come back as gap rows (nulls), so at most 300 rows.
    assert 180 <= reads["gpu_samples_1h"]["points"] <= 300
    # The 30-day window reaches the rollups: 8 h of data in 2.4 h buckets.
    assert reads["gpu_samples_30d"]["points"] >= 3


def test_bad_bench_input_is_one_line_and_a_nonzero_exit() -> None:
    got = CliRunner().invoke(app, ["bench", "retention", "--period", "2", "--old-period", "1"])
    assert got.exit_code == 2
    assert got.output.strip() == "trainguard: --old-period must be at least --period"
