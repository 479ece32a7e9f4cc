"""The in-process live bus: the ingest writer and the engine publish, SSE clients
subscribe with a topic filter. Publishing never blocks: a slow client loses messages
(and reloads from the REST API), it never slows ingest."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

# What a subscription's queue holds last when the bus closes.
CLOSED: tuple[str, Any] = ("", None)


@dataclass(eq=False)
class Subscription:
    topics: frozenset[str]
    queue: asyncio.Queue[tuple[str, Any]] = field(default_factory=lambda: asyncio.Queue(1000))
    dropped: int = 0


class LiveBus:
    def __init__(self) -> None:
        self._subs: set[Subscription] = set()
        self._lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    def subscribe(self, topics: frozenset[str]) -> Subscription:
        sub = Subscription(topics)
        with self._lock:
            self._subs.add(sub)
        if self.closed:
            sub.queue.put_nowait(CLOSED)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._subs.discard(sub)

    def close(self) -> None:
        """From the event loop: the server stops; every stream wakes and ends, so no open
        stream holds the shutdown (EventSource reconnects, to another replica or later)."""
        self.closed = True
        with self._lock:
            subs = list(self._subs)
        for s in subs:
            if s.queue.full():  # a slow client: its oldest message makes room
                s.queue.get_nowait()
            s.queue.put_nowait(CLOSED)

    def wants(self, topic: str) -> bool:
        with self._lock:
            return any(topic in s.topics for s in self._subs)

    def publish(self, topic: str, name: str, data: Any) -> None:
        """Thread-safe; from the event loop or any thread."""
        with self._lock:
            targets = [s for s in self._subs if topic in s.topics]
        if not targets or self.loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            for s in targets:
                self._put(s, name, data)
        else:
            self.loop.call_soon_threadsafe(self._fan_out, targets, name, data)

    def _fan_out(self, targets: list[Subscription], name: str, data: Any) -> None:
        for s in targets:
            self._put(s, name, data)

    @staticmethod
    def _put(sub: Subscription, name: str, data: Any) -> None:
        try:
            sub.queue.put_nowait((name, data))
        except asyncio.QueueFull:
            sub.dropped += 1
