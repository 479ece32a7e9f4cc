"""Helpers for tests: free ports, waiting on conditions, stopping a process session, the
test token."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
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


def stop_session(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process's session (start_new_session=True), SIGKILL if it is still
    there after 20 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
