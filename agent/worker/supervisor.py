"""The agent's side of the warm pool: `PoolProcess`, an agent component (start/stop).

It runs `python -m trainguard.worker.pool` (with `python`, by default the agent's own
interpreter: the workers' Python, which has torch) and restarts it when it dies, with a
backoff (1 s doubling to 30 s), except after the pool's setup error (exit 3: a
`--preload` module that does not import, no torch): that is said once, in the pool's
own line on the agent's stderr, and the workers run cold. The pool's output goes to the
agent's stderr. `stats()` asks the pool for its idle and busy interpreters and adds the
memory of the pool process and its idle interpreters (RSS, and PSS, which splits the
pages they share after the fork) from /proc; the agent's /metrics and `trainguard bench
agent` report it. Imports the standard library only (the agent has no torch).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

import msgspec

from trainguard.protocol import pool as messages

log = logging.getLogger(__name__)

SETUP_ERROR = 3  # trainguard.worker.pool.SETUP_ERROR (not imported: it imports torch)


def proc_memory(pid: int) -> dict[str, int]:
    """rss and pss of a process in bytes ({} when unreadable)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss"):
                    out[key.lower()] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode()
        fields = raw[raw.rfind(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def query(path: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """The pool's `stats` answer, None when no pool answers at `path`."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.settimeout(timeout)
        s.connect(path)
        s.send(messages.encode(messages.StatsRequest()))
        data = s.recv(1 << 16)
        return msgspec.to_builtins(messages.decode_stats(data)) if data else None
    except (OSError, ValueError):
        return None
    finally:
        s.close()


class PoolProcess:
    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        size: int,
        preload: list[str] | tuple[str, ...] = (),
        python: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.pool_socket = str(socket_path)
        self.size, self.preload = size, list(preload)
        self.python = python or sys.executable
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.gave_up: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def command(self) -> list[str]:
        cmd = [self.python, "-m", "trainguard.worker.pool", "--socket", self.pool_socket]
        cmd += ["--size", str(self.size)]
        if self.preload:
            cmd += ["--preload", ",".join(self.preload)]
        return cmd

    def start(self) -> None:
        self._stop.clear()
        self._spawn()  # in the caller's thread: prctl's parent is the agent's main thread
        self._thread = threading.Thread(target=self._supervise, name="worker-pool", daemon=True)
        self._thread.start()

    def _spawn(self) -> None:
        env = dict(os.environ if self.env is None else self.env)
        self.proc = subprocess.Popen(self.command(), env=env, stdin=subprocess.DEVNULL)
        self.starts += 1

    def _supervise(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            proc = self.proc
            if proc is None:
                return
            code = proc.wait()
            if self._stop.is_set():
                return
            if code == SETUP_ERROR:
                self.gave_up = f"the pool exited with its setup error (exit {code})"
                log.warning("worker pool: %s; workers run cold", self.gave_up)
                return
            log.warning("worker pool exited (%s); restarting in %.0f s", code, backoff)
            if self._stop.wait(backoff):
                return
            backoff = min(30.0, backoff * 2)
            try:
                # a thread's child: prctl(PDEATHSIG) fires when this thread ends, i.e. stop()
                self._spawn()
            except OSError as exc:
                log.error("worker pool: cannot start %s: %s", self.python, exc)
                return

    def stop(self) -> None:
        self._stop.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def stats(self) -> dict[str, Any] | None:
        """What the pool says of itself, plus the memory and CPU time of the pool process
        and its idle interpreters (not of workers: they are the job's)."""
        st = query(self.pool_socket)
        if st is None:
            return None
        pids = [int(st["pid"]), *(int(p) for p in st.get("idle", []))]
        mem = [proc_memory(p) for p in pids]
        cpu = [proc_cpu_s(p) for p in pids]
        st["rss_bytes"] = sum(m.get("rss", 0) for m in mem)
        st["pss_bytes"] = sum(m.get("pss", 0) for m in mem)
        st["template_rss_bytes"] = mem[0].get("rss", 0)
        st["cpu_s"] = sum(c for c in cpu if c is not None)
        return st
