"""The real Alembic scripts on both databases: head on an empty database, a full
downgrade/upgrade round trip, and no drift between the models and the migrations."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from trainguard.backend import db
from trainguard.backend.models import Base


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_to_head_creates_every_table(db_url: str) -> None:
    assert _tables(db_url) == set(Base.metadata.tables)


def test_downgrade_and_upgrade_round_trip(db_url: str) -> None:
    db.downgrade(db_url, "0001")
    assert "incidents" not in _tables(db_url)
    assert "samples" in _tables(db_url)
    db.downgrade(db_url, "base")
    assert _tables(db_url) == set()
    db.upgrade(db_url)
    assert _tables(db_url) == set(Base.metadata.tables)


def test_models_match_migrations(db_url: str) -> None:
    engine = create_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == [], f"models and migrations differ; write a migration: {diff}"


def test_0009_keeps_samples_and_fills_gpus_lost(db_url: str) -> None:
    """Samples survive losing their id and ts index, and each node's lost GPUs are counted
    from their latest samples: n1's GPU 1 fell off the bus (its latest sample has no
    reading, an earlier one had), n2's GPUs are fine; and back down again."""
    db.downgrade(db_url, "0008")
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO nodes (id, name, simulated, cordoned, first_seen, last_seen) "
                "VALUES (1, 'n1', false, false, 0, 0), (2, 'n2', false, false, 0, 0)"
            )
        )
        conn.execute(
            text(
                'INSERT INTO gpus (id, node_id, uuid, "index", name, pci_bus_id, simulated) '
                "VALUES (1, 1, 'G1', 0, '', '', false), (2, 1, 'G2', 1, '', '', false), "
                "(3, 2, 'G3', 0, '', '', false)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO samples (gpu_id, ts, util) VALUES "
                "(1, 1, 50), (1, 2, 50), (2, 1, 50), (2, 2, NULL), (3, 2, NULL), (3, 3, 10)"
            )
        )
    db.upgrade(db_url)
    with engine.connect() as conn:
        lost = dict(conn.execute(text("SELECT name, gpus_lost FROM nodes")).all())
        kept = conn.execute(text("SELECT gpu_id, ts FROM samples ORDER BY gpu_id, ts")).all()
    assert lost == {"n1": 1, "n2": 0}
    assert [tuple(r) for r in kept] == [(1, 1), (1, 2), (2, 1), (2, 2), (3, 2), (3, 3)]
    assert {c["name"] for c in inspect(engine).get_columns("samples")} >= {"gpu_id", "ts"}
    assert "id" not in {c["name"] for c in inspect(engine).get_columns("samples")}
    db.downgrade(db_url, "0008")
    with engine.connect() as conn:
        ids = conn.execute(text("SELECT id FROM samples ORDER BY id")).scalars().all()
    engine.dispose()
    assert len(ids) == 6 and len(set(ids)) == 6  # every sample numbered again
    db.upgrade(db_url)


def test_0011_buckets_every_sample_by_its_time(db_url: str) -> None:
    """The database fills each sample's bucket, floor(ts / 8), on the way up (existing rows)
    and on every insert after it, the same as the readers' sample_bucket; the index leads
    with it. Down again, the column goes and (gpu_id, ts) is the index once more."""
    from trainguard.backend.models import sample_bucket

    times = [0.0, 7.999, 8.0, 15.5, 1_700_000_003.5, 1.7e10]
    db.downgrade(db_url, "0010")
    engine = create_engine(db_url)
    with engine.begin() as conn:
        for ts in times[:3]:
            conn.execute(text("INSERT INTO samples (gpu_id, ts) VALUES (1, :ts)"), {"ts": ts})
    db.upgrade(db_url)
    with engine.begin() as conn:
        for ts in times[3:]:
            conn.execute(text("INSERT INTO samples (gpu_id, ts) VALUES (2, :ts)"), {"ts": ts})
        got = conn.execute(text("SELECT ts, bucket FROM samples ORDER BY ts")).all()
    assert [(r[0], r[1]) for r in got] == [(ts, sample_bucket(ts)) for ts in times]
    assert [r[1] for r in got] == [0, 0, 1, 1, 212_500_000, 2_125_000_000]
    indexes = {i["name"]: i["column_names"] for i in inspect(engine).get_indexes("samples")}
    assert indexes == {"ix_samples_bucket_gpu": ["bucket", "gpu_id"]}  # 0012's
    db.downgrade(db_url, "0011")
    indexes = {i["name"]: i["column_names"] for i in inspect(engine).get_indexes("samples")}
    assert indexes == {"ix_samples_bucket_gpu_ts": ["bucket", "gpu_id", "ts"]}
    db.downgrade(db_url, "0010")
    with engine.connect() as conn:
        kept = conn.execute(text("SELECT ts FROM samples ORDER BY ts")).scalars().all()
    assert kept == times
    assert "bucket" not in {c["name"] for c in inspect(engine).get_columns("samples")}
    indexes = {i["name"]: i["column_names"] for i in inspect(engine).get_indexes("samples")}
    engine.dispose()
    assert indexes == {"ix_samples_gpu_ts": ["gpu_id", "ts"]}
    db.upgrade(db_url)
