"""The real Alembic scripts on both databases: head on an empty database, a full
downgrade/upgrade round trip, and no drift between the models and the migrations."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

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
