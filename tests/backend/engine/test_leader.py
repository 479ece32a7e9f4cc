"""Leader election on PostgreSQL: a session-level advisory lock on a dedicated connection.
Two engines on one database: exactly one leads; when the leader's connection closes,
the other takes over; a leader that shuts down hands over at once."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from tests.support import AUTH, TOKEN, wait_for
from trainguard.backend.engine.leader import (
    ENGINE_LOCK_KEY,
    AdvisoryLockLeadership,
    SingleProcessLeadership,
    leadership_for,
)
from trainguard.backend.models import Base
from trainguard.protocol import wire

pytestmark = pytest.mark.postgres


def terminate(url: str, pid: int) -> None:
    """What a dead leader looks like to PostgreSQL: its session ends."""
    admin = create_engine(url)
    with admin.begin() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
    admin.dispose()


def lock_holder(url: str) -> int | None:
    """The server process of the session that holds the engine's lock (pg_locks)."""
    admin = create_engine(url)
    with admin.connect() as conn:
        pid = conn.execute(
            text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " AND classid = :hi AND objid = :lo AND objsubid = 1"
            ),
            {"hi": ENGINE_LOCK_KEY >> 32, "lo": ENGINE_LOCK_KEY & 0xFFFFFFFF},
        ).scalar()
    admin.dispose()
    return None if pid is None else int(pid)


def test_sqlite_is_always_the_leader() -> None:
    lead = leadership_for("sqlite:///x.db")
    assert isinstance(lead, SingleProcessLeadership) and lead.ensure() and lead.is_leader


def test_exactly_one_leads_and_the_other_takes_over(pg_database: str) -> None:
    a = AdvisoryLockLeadership(pg_database, retry_s=0.2)
    b = AdvisoryLockLeadership(pg_database, retry_s=0.2)
    try:
        assert a.ensure() is True
        assert b.ensure() is False
        assert a.ensure() is True and b.ensure() is False  # and it stays so
        holder = lock_holder(pg_database)
        assert holder is not None
        terminate(pg_database, holder)
        t0 = time.monotonic()
        wait_for(b.ensure, 10, 0.05)
        takeover = time.monotonic() - t0
        assert a.ensure() is False and a.lost == 1  # it notices and stands by
        assert b.is_leader and not a.is_leader
        b.release()  # a clean shutdown hands over at the next try
        wait_for(a.ensure, 10, 0.05)
        assert b.ensure() is False
        print(f"takeover after the leader's session ended: {takeover:.2f} s")
    finally:
        a.release()
        b.release()


@pytest.fixture
def pg_apps(pg_database: str, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    from fastapi.testclient import TestClient

    from trainguard.backend.app import create_app
    from trainguard.backend.settings import Settings

    engine = create_engine(pg_database)
    with engine.begin() as conn:
        names = ", ".join(t.name for t in Base.metadata.sorted_tables)
        conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
    engine.dispose()
    clients: list[Any] = []

    def make() -> Any:
        settings = Settings(database_url=pg_database, admin_token=TOKEN, data_dir=tmp_path)
        client = TestClient(create_app(settings), headers=AUTH)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.__exit__(None, None, None)


def _leaders(*clients: Any) -> list[bool]:
    return [c.app.state.decision_engine.leadership.is_leader for c in clients]


def _fault(client: Any, seq: int, job: str) -> None:
    now = time.time()
    batch = wire.Batch(
        node="n1",
        agent_id="agent-n1",
        seq=seq,
        sent_at=now,
        ranks=[wire.RankStatus(job=job, rank=0, pid=100)],
        events=[wire.Event(kind="exception", ts=now, job=job, rank=0)],
    )
    assert client.post("/api/v1/ingest", content=wire.encode(batch)).status_code == 200


def test_two_backends_decide_once_and_hand_over(
    pg_apps: Callable[[], Any], pg_database: str
) -> None:
    first, second = pg_apps(), pg_apps()
    wait_for(lambda: sum(_leaders(first, second)) == 1)
    leader, other = (first, second) if _leaders(first, second)[0] else (second, first)
    # Evidence stored by the replica that does not lead is decided by the leader, once.
    _fault(other, 1, "job-a")
    incs = wait_for(lambda: other.get("/api/v1/incidents").json())
    assert len(incs) == 1 and len(incs[0]["commands"]) == 1
    assert other.get("/api/v1/engine").json()["leader"] is False
    assert leader.get("/api/v1/engine").json()["decisions"] == 1

    # The leader's lock connection dies: the other replica takes over within seconds.
    holder = lock_holder(pg_database)
    assert holder is not None
    terminate(pg_database, holder)
    wait_for(lambda: _leaders(other)[0], 10)
    wait_for(lambda: not _leaders(leader)[0], 10)
    _fault(leader, 2, "job-b")  # ingest still works on the replica that lost the lead
    inc = wait_for(lambda: other.get("/api/v1/incidents", params={"job": "job-b"}).json())
    assert len(inc) == 1 and other.get("/api/v1/engine").json()["decisions"] == 1
    # The first incident was not decided again by the new leader (it read the cursor).
    assert len(other.get("/api/v1/incidents", params={"job": "job-a"}).json()) == 1
    assert len(other.get("/api/v1/incidents", params={"job": "job-a"}).json()[0]["commands"]) == 1
    assert sum(_leaders(first, second)) == 1
