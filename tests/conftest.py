"""Shared fixtures: a real database (SQLite file or PostgreSQL) migrated by the real Alembic
scripts, and the real app on top of it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.invariants import check as check_invariants
from tests.support import AUTH, TOKEN, free_port, wait_for
from trainguard.backend import db
from trainguard.backend.models import Base

PG_URL = os.environ.get(
    "TRAINGUARD_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@contextlib.contextmanager
def scratch_pg_database(
    prefix: str, needed_for: str, migrate: Callable[[str], None] = db.upgrade
) -> Iterator[str]:
    """A database of its own, created from the server's `test` database, migrated by
    `migrate` (its URL), and dropped afterwards (its connections closed first)."""
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # CI has PostgreSQL; say so loudly if it is missing
        pytest.fail(f"PostgreSQL at {PG_URL} is required for {needed_for}: {exc}")
    url = make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    try:
        migrate(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
                {"n": name},
            )
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


def cli_upgrade(url: str) -> None:
    """Migrate by the real `trainguard db upgrade`, in a process of its own."""
    up = subprocess.run(
        [sys.executable, "-m", "trainguard.agent.cli", "db", "upgrade", "--database-url", url],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert up.returncode == 0, up.stderr


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A database of its own for this test session."""
    with scratch_pg_database("tg_test", "the postgres tests") as url:
        yield url


def _truncate(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        names = ", ".join(t.name for t in Base.metadata.sorted_tables)
        conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Each test runs on both databases, on an empty schema at head."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'trainguard.db'}"
        db.upgrade(url)
        yield url
    else:
        url = request.getfixturevalue("pg_database")
        _truncate(url)
        yield url


@pytest.fixture
def make_client(db_url: str, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Builds a TestClient over the real app (lifespan runs: writer thread, bus)."""
    from fastapi.testclient import TestClient

    from trainguard.backend.app import create_app
    from trainguard.backend.settings import Settings

    clients: list[TestClient] = []

    def make(**overrides: Any) -> TestClient:
        settings = Settings(database_url=db_url, admin_token=TOKEN, data_dir=tmp_path, **overrides)
        client = TestClient(create_app(settings), headers=AUTH)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.__exit__(None, None, None)
    if clients:
        check_invariants(db_url)  # over every incident the test produced


@pytest.fixture
def client(make_client: Callable[..., Any]) -> Any:
    return make_client()


@pytest.fixture
def live_url(client: Any) -> Iterator[str]:
    """The `client` fixture's app under a real uvicorn on a loopback port (for what
    TestClient cannot do, such as reading the start of a stream that never ends, or a
    program that speaks plain HTTP)."""
    import uvicorn

    app = client.app
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 10, 0.02)
    yield f"http://127.0.0.1:{server.config.port}"
    server.should_exit = True
    thread.join(10)
