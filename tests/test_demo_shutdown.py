"""SIGTERM to `trainguard demo` ends every process it started: the server, the agents, both
ft_launchers, their workers (in sessions of their own) and what those daemonized, within
10 s and with exit code 0 (real processes, the real training job)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support import free_port, wait_for

pytestmark = pytest.mark.slow


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start ticks), None once the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return int(fields[1]), fields[0], int(fields[19])


def _processes() -> dict[int, tuple[int, str, int]]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            out[int(entry)] = st
    return out


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _tree_and_mentions(root: int, needle: str) -> dict[int, int]:
    """{pid: start ticks} of every process below root, and of every process whose command
    line mentions `needle` (a daemonized one that left the tree)."""
    procs = _processes()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    found, todo = {}, [root]
    while todo:
        for child in kids.get(todo.pop(), []):
            found[child] = procs[child][2]
            todo.append(child)
    for pid, (_, _, start) in procs.items():
        if pid not in (root, os.getpid()) and needle in _cmdline(pid):
            found[pid] = start
    return found


def _running(recorded: dict[int, int]) -> dict[int, str]:
    """Those of the recorded processes still running (a zombie has ended), with their
    command lines."""
    out = {}
    for pid, start in recorded.items():
        st = _stat(pid)
        if st is not None and st[2] == start and st[1] not in ("Z", "X"):
            out[pid] = _cmdline(pid)
    return out


def test_sigterm_stops_the_demo_and_every_process_it_started(tmp_path: Path) -> None:
    port = free_port()
    data_dir = (tmp_path / "demo").resolve()
    log = tmp_path / "demo.out"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainguard.agent.cli",
                "demo",
                "--port",
                str(port),
                "--data-dir",
                str(data_dir),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
    recorded: dict[int, int] = {}
    try:
        token = wait_for(lambda: re.search(r"token: (\S+)\)", log.read_text()), 90).group(1)
        api = httpx.Client(
            base_url=f"http://127.0.0.1:{port}/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=5,
        )

        def ranks_stepping() -> list[dict]:
            r = api.get("/jobs/demo-1")
            if r.status_code != 200:
                return []
            ranks = r.json()["ranks"]
            stepping = [x for x in ranks if (x["last_step"] or 0) >= 3]
            return ranks if len(stepping) == 4 else []

        ranks = wait_for(ranks_stepping, 180, every=0.5)
        recorded = _tree_and_mentions(proc.pid, str(data_dir))
        # the server, 2 agents, 2 launchers and the 4 ranks at least
        assert len(recorded) >= 9, recorded
        assert {r["pid"] for r in ranks} <= set(recorded)

        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(10)
        except subprocess.TimeoutExpired:
            pytest.fail("the demo did not exit within 10 s of SIGTERM")
        assert rc == 0, log.read_text()[-2000:]
        recorded |= {
            pid: start
            for pid, start in _tree_and_mentions(proc.pid, str(data_dir)).items()
            if pid != proc.pid
        }
        assert _running(recorded) == {}
        assert "Traceback" not in log.read_text()
    finally:
        # Leave nothing behind, whatever failed above.
        for pid, start in recorded.items():
            if _running({pid: start}):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
