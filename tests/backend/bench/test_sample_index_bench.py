"""`trainguard bench sample-index` at a tiny size: every layout written in the goal's
pattern, every row counted, and its scratch tables gone after it."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect

from trainguard.backend.bench import sample_index


def test_every_layout_writes_the_pattern_and_leaves_no_table(pg_database: str) -> None:
    result = sample_index.run(pg_database, gpus=64, seconds=6, window=4, batch_s=2)
    windows = result["windows"]
    # Per layout: a row at 4 simulated s and one at the end (6 s); each second half the
    # 8 nodes send 2 s of their 8 GPUs' samples: 4 x 2 x 8 = 64 rows a second.
    assert [(w["layout"], w["simulated_s"], w["rows"]) for w in windows] == [
        ("gpu_ts", 4, 256),
        ("gpu_ts", 6, 128),
        ("bucket_gpu_ts", 4, 256),
        ("bucket_gpu_ts", 6, 128),
        ("bucket_gpu", 4, 256),
        ("bucket_gpu", 6, 128),
    ]
    assert all(w["index_blocks_read"] >= 0 for w in windows)
    # Each layout's index size is reported (deduplication shows only at scale: a leaf
    # is deduplicated when it would split).
    size = result["index_bytes_per_row"]
    assert set(size) == {"gpu_ts", "bucket_gpu_ts", "bucket_gpu"}
    assert all(v > 0 for v in size.values())
    assert all(w["wal_bytes_per_row"] > 50 for w in windows)  # a heap row and an index entry
    assert all(w["pg_cpu_us_per_row"] >= 0 and w["wall_us_per_row"] > 0 for w in windows)
    engine = create_engine(pg_database)
    tables = inspect(engine).get_table_names()
    engine.dispose()
    assert not [t for t in tables if t.startswith("bench_sample_index")]
    assert "pg_cpu_us_per_row" in sample_index.table(result)


def test_one_layout_can_be_chosen(pg_database: str) -> None:
    result = sample_index.run(
        pg_database, gpus=16, seconds=2, window=2, batch_s=2, layouts=["bucket_gpu"]
    )
    assert [w["layout"] for w in result["windows"]] == ["bucket_gpu"]
    assert list(result["index_bytes_per_row"]) == ["bucket_gpu"]
