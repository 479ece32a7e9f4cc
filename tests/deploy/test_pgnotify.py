"""LISTEN/NOTIFY fan-out of the live bus: two buses ("replicas", each with its own
connections and replica id) on the real PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from trainguard.backend.live.bus import LiveBus
from trainguard.backend.live.pgnotify import (
    PAYLOAD_LIMIT,
    PgNotifyBus,
    bus_for,
    encode_notifications,
)

pytestmark = pytest.mark.postgres


async def _until(cond: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


@pytest.fixture
def pair(pg_database: str) -> Iterator[tuple[PgNotifyBus, PgNotifyBus]]:
    a = PgNotifyBus(pg_database, channel="tg_test_live", interest_every_s=0.3)
    b = PgNotifyBus(pg_database, channel="tg_test_live", interest_every_s=0.3)
    a.start()
    b.start()
    yield a, b
    a.stop()
    b.stop()


def test_a_message_reaches_a_subscriber_on_the_other_replica_once(
    pair: tuple[PgNotifyBus, PgNotifyBus],
) -> None:
    a, b = pair

    async def main() -> None:
        a.loop = b.loop = asyncio.get_running_loop()
        on_b = b.subscribe(frozenset({"events", "node:n1"}))
        on_a = a.subscribe(frozenset({"events"}))
        await _until(lambda: a.wants("node:n1") and b.wants("events"))
        assert not a.wants("node:n2") and not b.wants("nodes")
        a.publish("node:n1", "samples", {"node": "n1", "samples": [{"uuid": "GPU-1", "util": 9}]})
        a.publish("events", "event", {"id": 1, "kind": "xid"})
        a.publish("nodes", "nodes", [{"name": "n1"}])  # per replica: never crosses
        got = [await asyncio.wait_for(on_b.queue.get(), 10) for _ in range(2)]
        assert got == [
            ("samples", {"node": "n1", "samples": [{"uuid": "GPU-1", "util": 9}]}),
            ("event", {"id": 1, "kind": "xid"}),
        ]
        assert await asyncio.wait_for(on_a.queue.get(), 10) == ("event", {"id": 1, "kind": "xid"})
        await asyncio.sleep(0.3)  # anything echoed back or forwarded twice would be here now
        assert on_a.queue.empty() and on_b.queue.empty()
        assert b.stats.received == 2 and a.stats.received == 0

    asyncio.run(main())


def test_a_message_larger_than_a_notification_is_chunked_and_reassembled(
    pair: tuple[PgNotifyBus, PgNotifyBus],
) -> None:
    a, b = pair
    import random

    rng = random.Random(7)
    big = {"node": "n1", "samples": [{"uuid": f"GPU-{i}", "v": rng.random()} for i in range(3000)]}
    notes = encode_notifications("r", 1, "node:n1", "samples", big)
    assert len(notes) > 1 and all(len(n.encode()) <= PAYLOAD_LIMIT for n in notes)

    async def main() -> None:
        a.loop = b.loop = asyncio.get_running_loop()
        sub = b.subscribe(frozenset({"node:n1"}))
        await _until(lambda: a.wants("node:n1"))
        a.publish("node:n1", "samples", big)
        assert await asyncio.wait_for(sub.queue.get(), 10) == ("samples", big)

    asyncio.run(main())


def test_interest_expires_when_the_other_replica_has_no_subscriber_any_more(
    pair: tuple[PgNotifyBus, PgNotifyBus],
) -> None:
    a, b = pair

    async def main() -> None:
        a.loop = b.loop = asyncio.get_running_loop()
        sub = b.subscribe(frozenset({"job:j1"}))
        await _until(lambda: a.wants("job:j1"))
        b.unsubscribe(sub)
        await _until(lambda: not a.wants("job:j1"), timeout=5)

    asyncio.run(main())


def test_sqlite_gets_the_in_process_bus_and_bad_notifications_are_ignored(
    pg_database: str,
) -> None:
    assert type(bus_for("sqlite:///x.db")) is LiveBus
    bus = PgNotifyBus(pg_database)  # not started: handle() alone
    for junk in ("", "m|x", "m|other|1|{not json", "c|other|1|0|2|abc", "i|other|2|[]"):
        bus.handle(junk)
    assert bus.stats.received == 0 and bus.stats.errors >= 2
