"""Helpers for tests: free ports, waiting on conditions, the test token."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

TOKEN = "test-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, every: float = 0.1) -> Any:
    """Poll a condition until it is truthy or the deadline passes (no blind sleeps)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout} s (last value: {last!r})")
