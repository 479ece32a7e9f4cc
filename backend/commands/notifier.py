"""Wakes long-polling agents when a command is created in this process. Other replicas'
commands are found by the poll's periodic database check. When the server starts to stop
(`close`), every waiter wakes at once and the polls answer "retry" instead of holding the
shutdown until uvicorn cancels them."""

from __future__ import annotations

import asyncio
import contextlib


class Notifier:
    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self.closing = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._event = asyncio.Event()

    def notify(self) -> None:
        """Thread-safe: wake every waiter."""
        if self.loop is None or self._event is None:
            return
        self.loop.call_soon_threadsafe(self._wake)

    def close(self) -> None:
        """From the event loop: the server stops; wake every waiter, and for good."""
        self.closing = True
        if self._event is not None:
            self._wake()

    def _wake(self) -> None:
        assert self._event is not None
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        if self.closing:
            return
        if self._event is None:
            await asyncio.sleep(timeout)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
