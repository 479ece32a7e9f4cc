"""`trainguard bench sample-layout` at a tiny size: every layout holds the round's samples
(a row each, or a row per GPU), the packed records read back as written, and its scratch
tables are gone after it."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, inspect

from trainguard.backend.bench import sample_layout
from trainguard.backend.bench.sample_index import _READINGS


def test_every_layout_stores_the_rounds_and_leaves_no_table(pg_database: str) -> None:
    result = sample_layout.run(pg_database, gpus=16, batch_s=4, rounds=2)
    by = {x["layout"]: x for x in result["layouts"]}
    assert list(by) == ["row", "row-unindexed", "arrays", "packed"]
    # 16 GPUs x 4 samples x 2 rounds: a row per sample, or a row per GPU per batch.
    assert by["row"]["rows"] == by["row-unindexed"]["rows"] == 128
    assert by["arrays"]["rows"] == by["packed"]["rows"] == 32
    # Without the index the same rows take less room: the index's bytes are gone.
    assert by["row-unindexed"]["table_bytes_per_sample"] < by["row"]["table_bytes_per_sample"]
    for x in by.values():
        assert x["wal_bytes_per_sample"] > 0 and x["table_bytes_per_sample"] > 0
        assert x["pg_cpu_us_per_sample"] >= 0 and x["client_cpu_us_per_sample"] >= 0
    engine = create_engine(pg_database)
    tables = inspect(engine).get_table_names()
    engine.dispose()
    assert not [t for t in tables if t.startswith("bench_sample_layout")]
    assert "| packed | 32 |" in sample_layout.table(result)


def test_a_packed_record_reads_back_as_its_readings() -> None:
    records = b"".join(sample_layout.RECORD.pack(1.7e9 + k, *_READINGS) for k in range(3))
    got = sample_layout.unpack(records)
    assert [r[0] for r in got] == [1.7e9, 1.7e9 + 1, 1.7e9 + 2]
    # float4 readings come back at float4's precision; the others exactly.
    assert got[1][1:] == pytest.approx(_READINGS, rel=1e-6)
    assert len(records) == 3 * sample_layout.RECORD.size
