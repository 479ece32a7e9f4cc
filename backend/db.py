"""Engine, sessions and migrations. One unit of work per request: the session dependency
commits on success and rolls back on error; services only add and flush."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

import trainguard.migrations as _migrations_pkg

MIGRATIONS_DIR = Path(_migrations_pkg.__file__).resolve().parent


class WriteWaiters:
    """SQLite: how many connections are inside a write statement right now, waiting for
    the database's write lock (or about to get it).

    SQLite's busy handler is not fair: a waiting writer sleeps (up to 100 ms) and retries,
    and a writer that commits back to back (the ingest writer under load) takes the lock
    again within microseconds of each commit. Under 2,048 nodes of ingest, agents' acks
    waited 5-30 s or failed (docs/engine.md). The ingest writer reads this count after
    each commit and holds off its next transaction while someone waits (`yield_to`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = 0

    @property
    def count(self) -> int:
        return self._n

    def enter(self) -> None:
        with self._lock:
            self._n += 1

    def leave(self) -> None:
        with self._lock:
            self._n -= 1

    def yield_to(self, at_most_s: float = 0.2) -> None:
        """Wait until no other writer waits, at most `at_most_s` (a waiter's busy handler
        sleeps up to 100 ms between tries)."""
        deadline = time.monotonic() + at_most_s
        while self._n and time.monotonic() < deadline:
            time.sleep(0.002)


_write_waiters: weakref.WeakKeyDictionary[Engine, WriteWaiters] = weakref.WeakKeyDictionary()
_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLAC")


def write_waiters(engine: Engine) -> WriteWaiters | None:
    """The engine's WriteWaiters (SQLite engines made by make_engine), else None."""
    return _write_waiters.get(engine)


def _count_write_waiters(engine: Engine) -> None:
    waiters = _write_waiters.setdefault(engine, WriteWaiters())

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn: Any, _cur: Any, statement: str, *_: Any) -> None:
        if not conn.info.get("ingest_writer") and statement.lstrip()[:6].upper() in _WRITES:
            conn.info["write_waiting"] = True
            waiters.enter()

    def _done(conn: Any) -> None:
        if conn is not None and conn.info.pop("write_waiting", False):
            waiters.leave()

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn: Any, *_: Any) -> None:
        _done(conn)

    @event.listens_for(engine, "handle_error")
    def _error(ctx: Any) -> None:
        _done(ctx.connection)


def make_sqlite_folder(url: str) -> None:
    """SQLite creates its file, not the folder it is in: create that folder (the data
    folder on a first run) so that every command opening the database works on a fresh
    TRAINGUARD_DATA_DIR, not only `trainguard server`."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)


def make_engine(url: str, **kw: Any) -> Engine:
    if url.startswith("sqlite"):
        make_sqlite_folder(url)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **kw)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _rec: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        _count_write_waiters(engine)
        return engine
    kw.setdefault("pool_size", 10)
    kw.setdefault("max_overflow", 20)
    kw.setdefault("pool_pre_ping", True)
    return create_engine(url, **kw)


def alembic_config(url: str) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    from alembic import command

    make_sqlite_folder(url)
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    from alembic import command

    make_sqlite_folder(url)
    command.downgrade(alembic_config(url), revision)


def get_session(request: Request) -> Iterator[Session]:
    factory: sessionmaker[Session] = request.app.state.sessions
    with factory() as session:
        try:
            yield session
            session.commit()
        except Exception:
            session.rollback()
            raise


# scope="function": the commit runs when the route returns, before the response is sent.
# With FastAPI's default ("request") it ran after the response: a client got 200 for a
# change not yet stored (a failed commit lost it), and its next request could miss it.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
