"""Helpers for tests: free ports, waiting on conditions, stopping a process session, the
test token."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.protocol import wire

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


def spooled_samples(spool: Path) -> int:
    """The samples held in an agent's spool directory, as the agent sees them while it
    runs (an outage's batches never sent share one file: agent/uplink/sender.py)."""
    samples = 0
    for p in spool.glob("*.batch") if spool.is_dir() else ():
        if p.name.startswith(".tmp-"):  # a write in flight
            continue
        with contextlib.suppress(FileNotFoundError):  # replayed meanwhile
            samples += len(wire.decode_batch(p.read_bytes()).samples)
    return samples
