"""The writer's backlog in /metrics: how many batches wait for the writer and how long the
oldest has waited, so an operator sees a backend that cannot keep up before its agents do."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Engine, text

from trainguard.backend.models import IngestBatch, Sample
from trainguard.protocol import wire

from .test_ingest import count


def batch(node: str, seq: int) -> bytes:
    now = time.time()
    return wire.encode(
        wire.Batch(
            node=node,
            agent_id="agent000001",
            seq=seq,
            sent_at=now,
            gpus=[wire.GpuInfo(uuid=f"GPU-{node}-0", index=0)],
            samples=[wire.GpuSample(uuid=f"GPU-{node}-0", ts=now, util=50.0)],
        )
    )


@contextlib.contextmanager
def writes_blocked(engine: Engine) -> Iterator[None]:
    """Another connection holds the lock the writer's next transaction needs: SQLite's
    write lock, or PostgreSQL's lock on `nodes` (every group updates its nodes)."""
    conn = engine.connect()
    try:
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.begin()
            conn.execute(text("LOCK TABLE nodes IN ACCESS EXCLUSIVE MODE"))
        yield
    finally:
        conn.rollback()
        conn.close()


def gauges(client: Any) -> tuple[float, float]:
    """(batches queued, seconds the oldest has waited) from /metrics."""
    metrics = client.get("/metrics").text

    def value(name: str) -> float:
        found = re.search(rf"^trainguard_ingest_{name} (\S+)$", metrics, re.M)
        assert found, name
        return float(found.group(1))

    return value("queued_batches"), value("queue_wait_seconds")


def test_a_blocked_writer_shows_its_queue_in_metrics_and_loses_nothing(
    make_client: Any, db_url: str
) -> None:
    client = make_client(writer_min_group_batches=1)
    assert gauges(client) == (0.0, 0.0)
    answers: list[int] = []
    posts: list[threading.Thread] = []

    def post(seq: int) -> None:
        answers.append(client.post("/api/v1/ingest", content=batch("n1", seq)).status_code)

    with writes_blocked(client.app.state.engine):
        # The writer takes the first batch and waits for the lock; the next ones queue.
        while gauges(client)[1] <= 0.3:
            assert len(posts) < 50, "the writer never backed up"
            posts.append(threading.Thread(target=post, args=(len(posts) + 1,)))
            posts[-1].start()
            time.sleep(0.4)
        queued, waited = gauges(client)
        assert 1 <= queued < len(posts) and waited > 0.3
    for t in posts:
        t.join(30)
    assert answers == [200] * len(posts)
    assert gauges(client) == (0.0, 0.0)
    assert count(db_url, Sample) == count(db_url, IngestBatch) == len(posts)
