"""The job launchers on this node, for the job's shape (which nodes train, which wait as
hot spares): every torchrun and ft_launcher process, read from /proc.

A hot spare is invisible to the rank table: its launcher waits in the rendezvous
(beyond `--nnodes` MAX, in torch's redundancy list) and starts no worker until a node
leaves, so no rank of it ever registers. Its command line says which launcher it is,
its job (the SDK's rule, trainguard.protocol.launchers) and its `--nnodes`.

Which launchers are this agent's: one whose environment names an agent socket
(TRAINGUARD_AGENT_SOCKET, as on a host that imitates several nodes, the demo and the
tests) belongs to the agent listening there; one that names none belongs to the agent on
the host's well-known socket (a real node: every launcher on the host is its agent's).
A launcher whose environment cannot be read (another user's, an agent not run as root)
names none.

Its state: `active` while live ranks of its job are registered here under it (or, where
they are no children of it, any live rank of its job here), `restarting` once they are
gone (it had some: between two rendezvous rounds), `spare` when it never had any.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from trainguard.agent.ranks.liveness import proc_info
from trainguard.protocol.discovery import SOCKET_ENV, socket_candidates
from trainguard.protocol.launchers import launcher_job, nnodes, parse_launcher
from trainguard.protocol.wire import (
    MAX_LAUNCHERS,
    MAX_RANKS,
    LauncherState,
    LauncherStatus,
    Name,
    wire_name,
)

log = logging.getLogger(__name__)

SCAN_S = 5.0  # /proc is read at most this often
RESEND_S = 30.0  # an unchanged list is sent again this often (the backend's freshness)
_CMDLINE_MAX = 64 * 1024
_ENVIRON_MAX = 1024 * 1024


def _read(path: str, limit: int) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def cmdline(pid: int, proc: str = "/proc") -> list[str]:
    raw = _read(f"{proc}/{pid}/cmdline", _CMDLINE_MAX) or b""
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def environ(pid: int, proc: str = "/proc") -> dict[str, str] | None:
    """The process's environment at its start; None when it cannot be read."""
    raw = _read(f"{proc}/{pid}/environ", _ENVIRON_MAX)
    if raw is None:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _boot_time(proc: str) -> float:
    try:
        with open(f"{proc}/stat", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


@dataclass(frozen=True)
class _Found:
    pid: int
    key: tuple[int, int]  # (pid, start ticks): a reused pid is another launcher
    job: str
    launcher: str
    span: tuple[int, int] | None
    started_at: float | None
    ppid: int


def _parent(pid: int, proc: str) -> int:
    raw = _read(f"{proc}/{pid}/stat", 4096) or b""
    text = raw.decode(errors="replace")
    try:
        return int(text[text.rfind(")") + 2 :].split()[1])
    except (IndexError, ValueError):
        return 0


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


class LauncherWatch:
    """The launchers of this agent's node, as `LauncherStatus`es for the uplink.

    `ranks` gives the live ranks registered here as (job, ppid) pairs (the server's
    table, read under its lock). `provider()` is the outbox's: the list when it changed
    since it was last sent, or every `resend_s`, else None (not in this batch)."""

    def __init__(
        self,
        socket_path: str,
        ranks: Callable[[], Iterable[tuple[str, int]]],
        *,
        scan_s: float = SCAN_S,
        resend_s: float = RESEND_S,
        proc: str = "/proc",
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket_path = socket_path
        # A launcher that names no socket is this agent's when it listens where the SDK
        # looks with no configuration (the host's agent).
        self.claims_unnamed = any(_same_path(socket_path, c) for c in socket_candidates())
        self.ranks = ranks
        self.scan_s, self.resend_s = scan_s, resend_s
        self.proc = proc
        self.monotonic = monotonic
        self._boot = _boot_time(proc)
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._had_ranks: set[tuple[int, int]] = set()  # (pid, start ticks)
        self._latest: list[LauncherStatus] = []
        self._scanned_at = float("-inf")
        self._sent: list[LauncherStatus] | None = None
        self._sent_at = float("-inf")
        self.scan_errors = 0

    def mine(self, env: dict[str, str] | None) -> bool:
        named = (env or {}).get(SOCKET_ENV, "").strip()
        if named:
            return _same_path(named, self.socket_path)
        return self.claims_unnamed

    def scan(self) -> list[LauncherStatus]:
        """Read /proc now: this node's launchers, by pid."""
        try:
            pids = sorted(int(n) for n in os.listdir(self.proc) if n.isdigit())
        except OSError:
            return []
        live = list(self.ranks())
        under: Counter[int] = Counter(ppid for _, ppid in live)
        job_of = {ppid: job for job, ppid in live}
        found = [f for pid in pids if (f := self._read_launcher(pid, job_of)) is not None]
        # A launcher's own forks (NVRx's rank monitors, forked: the same command line)
        # are no launchers of their own.
        pids_found = {f.pid for f in found}
        found = [f for f in found if f.ppid not in pids_found]
        # A job's ranks that are no launcher's children here (a wrapper script between
        # them) make its launchers here active; otherwise only a launcher's own do.
        parented = {f.job for f in found if under[f.pid]}
        jobs_here = {job for job, _ in live}
        out: list[LauncherStatus] = []
        for f in found:
            state: LauncherState
            if under[f.pid] or (f.job in jobs_here and f.job not in parented):
                self._had_ranks.add(f.key)
                state = "active"
            elif f.key in self._had_ranks:
                state = "restarting"
            else:
                state = "spare"
            try:
                out.append(
                    LauncherStatus(
                        job=msgspec.convert(f.job, Name),
                        pid=f.pid,
                        state=state,
                        launcher=f.launcher,  # type: ignore[arg-type]  # parse_launcher's
                        min_nodes=f.span[0] if f.span else None,
                        max_nodes=f.span[1] if f.span else None,
                        ranks=min(under[f.pid], MAX_RANKS),
                        started_at=f.started_at,
                    )
                )
            except msgspec.ValidationError:
                continue
        self._had_ranks &= {f.key for f in found}  # forget launchers that ended
        return out[:MAX_LAUNCHERS]

    def _read_launcher(self, pid: int, job_of: dict[int, str]) -> _Found | None:
        argv = cmdline(pid, self.proc)
        if not argv:
            return None
        line = parse_launcher(argv)
        if line.launcher is None:
            return None
        env = environ(pid, self.proc)
        if not self.mine(env):
            return None
        info = proc_info(pid) if self.proc == "/proc" else None
        if info is not None and info.state == "Z":
            return None
        env = env or {}
        job = job_of.get(pid)  # its workers' own name for the job
        if job is None:
            named = launcher_job(line, env)
            job = wire_name(named) if named else None
        if job is None:
            return None  # no id: only its workers could name the job
        started = None
        if info is not None and info.start_ticks and self._boot:
            started = round(self._boot + info.start_ticks / self._ticks, 3)
        return _Found(
            pid=pid,
            key=(pid, info.start_ticks if info else 0),
            job=job,
            launcher=line.launcher,
            span=nnodes(line, env),
            started_at=started,
            ppid=_parent(pid, self.proc),
        )

    def current(self) -> list[LauncherStatus]:
        """The latest scan, read again when it is `scan_s` old."""
        now = self.monotonic()
        if now - self._scanned_at >= self.scan_s:
            try:
                self._latest = self.scan()
            except Exception:  # never let /proc take the uplink down
                self.scan_errors += 1
                if self.scan_errors in (1, 10, 100):
                    log.exception("reading this node's launchers failed")
            self._scanned_at = now
        return self._latest

    def provider(self, force: bool = False) -> list[LauncherStatus] | None:
        """For the outbox's drain: the list when it changed or is due again (or `force`:
        the last one sent never arrived), else None."""
        latest = self.current()
        now = self.monotonic()
        if not force and latest == self._sent and now - self._sent_at < self.resend_s:
            return None
        self._sent, self._sent_at = latest, now
        return latest

    def describe(self) -> list[dict[str, Any]]:
        """The latest scan as plain dicts (logs, tests)."""
        return [msgspec.structs.asdict(s) for s in self._latest]
