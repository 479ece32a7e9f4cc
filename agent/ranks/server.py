"""The agent's side of the SDK channel: a Unix datagram socket the training ranks talk to.

`LocalServer(agent)` is an agent component (start/stop). Every datagram is decoded with
one decoder into a typed message of trainguard.protocol.messages and dispatched by its
type to the rank table (trainguard.agent.ranks.table), which turns it into the rank's state and
wire records in `agent.outbox`; the liveness watch (trainguard.agent.ranks.liveness) reports
ranks that exit, hang or stop heartbeating. A datagram of another protocol version, or a
malformed one, is counted (`rejected`) and said in a log line at most every
`reject_log_s` seconds; the server goes on.

The loop sleeps until something happens: a datagram, a rank's exit (its pidfd), or the
next instant a clock check can fire (a hang or heartbeat deadline, computed from the rank
table).

The socket: the configured `socket_path` (TRAINGUARD_AGENT_SOCKET), else the first
well-known place whose folder this agent can create (`trainguard.sdk.socket_candidates`,
the list the SDK tries in the same order); a live agent already there is not displaced.

The executor uses `request_restart` to reach the ranks and `wait_until` to follow them.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import selectors
import socket
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from trainguard.agent.ranks.launchers import LauncherWatch
from trainguard.agent.ranks.liveness import Liveness, ProcInfo, pid_reused, proc_info
from trainguard.agent.ranks.table import RankRecord, RankTable
from trainguard.protocol.discovery import SOCKET_DIRS_ENV, probe_socket, socket_candidates
from trainguard.protocol.messages import (
    MAX_DATAGRAM,
    Hello,
    Identity,
    InjectXid,
    Message,
    Rejected,
    Restart,
    decode_from_sdk,
    encode,
)
from trainguard.protocol.wire import MAX_TIMEOUT_S, LauncherStatus, RankStatus

__all__ = ["LocalServer", "ProcInfo", "RankRecord", "proc_info", "well_known_socket"]

T = TypeVar("T")

log = logging.getLogger(__name__)


def _prepare_folder(folder: str, mode: int, create_parents: bool = False) -> None:
    """Create the socket's folder (only the last part, unless `create_parents`) and check
    it is this user's (or root's) folder and writable; OSError saying why not."""
    if create_parents:
        os.makedirs(folder, mode=mode, exist_ok=True)
    elif not os.path.isdir(os.path.dirname(folder)):
        raise FileNotFoundError(errno.ENOENT, "its parent folder does not exist", folder)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, mode)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (os.geteuid(), 0):
        raise PermissionError(errno.EPERM, "not a folder of this user", folder)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "not writable", folder)


def well_known_socket() -> str:
    """The first well-known socket place whose folder this process can prepare (the
    first, /run/trainguard, open to every user; the others, the user's own, private).
    OSError naming every place tried when there is none."""
    override = bool(os.environ.get(SOCKET_DIRS_ENV, "").strip())
    tried = []
    for i, path in enumerate(socket_candidates()):
        folder = os.path.dirname(path)
        try:
            _prepare_folder(folder, 0o755 if i == 0 else 0o700, create_parents=override)
            return path
        except OSError as exc:
            tried.append(f"{folder}: {exc.strerror or exc}")
    raise OSError(f"no place for the SDK socket ({'; '.join(tried)}); set TRAINGUARD_AGENT_SOCKET")


class RejectLog:
    """Rejected datagrams, counted by reason; one log line at most every `every` seconds,
    with what was rejected since the previous line and the last reason in words."""

    def __init__(self, every: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.clock = clock
        self.counts: Counter[str] = Counter()  # since the server started
        self._unsaid: Counter[str] = Counter()  # since the last line
        self._next_line = -math.inf
        self.lines = 0

    def add(self, why: Rejected) -> None:
        self.counts[why.reason] += 1
        self._unsaid[why.reason] += 1
        now = self.clock()
        if now < self._next_line:
            return
        self._next_line = now + self.every
        total = sum(self._unsaid.values())
        reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(self._unsaid.items()))
        self._unsaid.clear()
        self.lines += 1
        log.warning(
            "SDK socket: %d datagram(s) rejected (%s), the last: %s; at most one such line "
            "every %.0f s",
            total,
            reasons,
            why,
            self.every,
        )


class LocalServer:
    def __init__(
        self,
        agent: Any,
        socket_path: str | None = None,
        reject_log_s: float = 60.0,
        settle_s: float = 3.0,
        **liveness: float,
    ) -> None:
        """`liveness`: the watch's intervals and thresholds (check_interval, hang_factor,
        hang_min_s, hang_first_step_s, heartbeat_timeout_s, keep_exited_s), with their
        defaults in `Liveness`. `settle_s`: see rank_statuses."""
        self.agent = agent
        self.settle_s = settle_s
        self._listing_from = 0.0  # start() sets it
        cfg = getattr(agent, "config", None)
        configured = socket_path or getattr(cfg, "socket_path", None)
        self.socket_path = str(configured) if configured else well_known_socket()
        # The first well-known place (/run/trainguard/agent.sock, also where the systemd
        # unit and the DaemonSet put it): ranks of every user send there, so the socket is
        # writable by all, whatever the agent's umask; its folder decides who reaches it.
        self.shared_socket = self.socket_path == socket_candidates()[0]
        self.table = RankTable(agent.outbox)
        # The node's torchrun/ft_launcher processes, active or waiting as hot spares,
        # for the uplink's batches (the job's shape).
        self.launchers = LauncherWatch(self.socket_path, self._live_parents)
        self.liveness = Liveness(self.table, **liveness)
        # How long a launcher restart command waits for new workers (the command loop's
        # restarted_timeout_s, set where both are made), reported with the ranks' timeouts.
        self.restart_wait_s: float | None = None
        self.rejects = RejectLog(reject_log_s)
        self.unknown_senders = 0  # messages from an address no identity message came from
        self.wakeups = 0  # times the loop woke up (datagrams, exits, deadlines, stop)
        self.cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._sel: selectors.BaseSelector | None = None
        self._wake_r = self._wake_w = -1
        self._next_check = math.inf  # monotonic time of the next clock check

    @property
    def ranks(self) -> dict[int, RankRecord]:
        """This node's ranks by pid (read under `cond` when consistency matters)."""
        return self.table.ranks

    @property
    def rejected(self) -> Counter[str]:
        """Datagrams rejected since start, by reason ("version", "malformed")."""
        return self.rejects.counts

    # --- component life cycle -----------------------------------------------------------

    def start(self) -> None:
        if not probe_socket(self.socket_path):
            raise OSError(
                f"another agent listens on {self.socket_path}; give this one a socket of "
                "its own (TRAINGUARD_AGENT_SOCKET) and its ranks the same path"
            )
        os.makedirs(os.path.dirname(self.socket_path) or ".", exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)  # a stale socket: nobody listens on it
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        sock.bind(self.socket_path)
        if self.shared_socket:
            os.chmod(self.socket_path, 0o666)  # ranks of any user; the agent runs as root
        sock.setblocking(False)
        self._sock = sock
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(sock, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self.liveness.selector = self._sel
        self.agent.outbox.ranks_provider = self.listed_ranks
        self.agent.outbox.launchers_provider = self.listed_launchers
        self._listing_from = time.monotonic() + self.settle_s
        self._stop.clear()
        self._next_check = math.inf
        self._thread = threading.Thread(target=self._run, name="tg-local", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self.cond:
            self.liveness.unwatch_all()
        if self._sel is not None:
            self.liveness.selector = None
            self._sel.close()
            self._sel = None
        if self._sock is not None:
            self._sock.close()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    # --- the loop -----------------------------------------------------------------------

    def _run(self) -> None:
        assert self._sock is not None and self._sel is not None
        sock, sel, watch = self._sock, self._sel, self.liveness
        while not self._stop.is_set():
            left = self._next_check - time.monotonic()
            ready = sel.select(None if left == math.inf else max(0.0, left))
            self.wakeups += 1
            if self._stop.is_set():
                return
            exited = [k.data for k, _ in ready if isinstance(k.data, RankRecord)]
            # epoll reports every ready fd: what a rank sent before it exited is seen
            # together with its pidfd, so a wake-up without the socket has nothing to read
            datagrams: list[tuple[bytes, Any]] = []
            drained = True
            if any(k.fileobj is sock for k, _ in ready):
                datagrams, drained = self._receive(sock)
            with self.cond:
                touched: list[RankRecord] = []
                for data, addr in datagrams:
                    rec = self._datagram(data, addr)
                    if rec is not None:
                        touched.append(rec)
                if drained:
                    # The socket is empty, so everything an exited rank sent (its steps,
                    # its "bye") is in the table before its exit is reported; otherwise the
                    # (level-triggered) pidfd is seen again on the next turn.
                    now = time.time()
                    for rec in exited:
                        watch.pidfd_exited(rec, now)
                        touched.append(rec)  # a held exit is looked at again soon
                mono = time.monotonic()
                if mono >= self._next_check:
                    self._next_check = watch.check(mono, time.time())
                elif touched:
                    # a message can only bring its own rank's deadline closer
                    now = time.time()
                    for rec in {id(r): r for r in touched}.values():
                        self._next_check = min(self._next_check, watch.check_rank(rec, mono, now))
                self.cond.notify_all()

    def _receive(
        self, sock: socket.socket, limit: int = 1024
    ) -> tuple[list[tuple[bytes, Any]], bool]:
        """The datagrams waiting on the socket (at most `limit`); True when it is empty."""
        out: list[tuple[bytes, Any]] = []
        while len(out) < limit:
            try:
                out.append(sock.recvfrom(MAX_DATAGRAM))
            except (BlockingIOError, InterruptedError):
                return out, True
            except OSError:
                if self._stop.is_set():
                    return out, True
                raise
        return out, False

    def _datagram(self, data: bytes, addr: Any) -> RankRecord | None:
        """Decode and handle one datagram (under `cond`); the rank it was about, if any."""
        try:
            msg = decode_from_sdk(data)
        except Rejected as why:
            self.rejects.add(why)
            return None
        return self._dispatch(msg, addr)

    def _dispatch(self, msg: Message, addr: Any) -> RankRecord | None:
        """One message, by its type: identity messages (re)register their rank, the
        others are about the rank that sends from `addr`."""
        if isinstance(msg, Identity):
            return self._identity(msg, addr)
        if isinstance(msg, InjectXid):
            self._inject_xid(msg)
            return None
        rec = self.table.sender(addr)
        if rec is None:
            self.unknown_senders += 1
            return None
        self.table.apply(rec, msg)
        return rec

    def _identity(self, msg: Identity, addr: Any) -> RankRecord:
        now = time.time()
        rec = self.table.ranks.get(msg.pid)
        info: ProcInfo | None = None
        if rec is None or rec.pidfd is None or isinstance(msg, Hello):
            # A watched live rank is known to be the same process: its pidfd would have
            # fired (a reused pid starts with "hello"); others are checked in /proc.
            info = proc_info(msg.pid)
            if rec is not None and info is not None and pid_reused(rec, info):
                self.liveness.unwatch(rec)  # the pid was reused by a new process
                if rec.alive:
                    self.liveness.exited(rec, None, now)
                rec = None
        if rec is None:
            rec = self.table.register(msg, info.start_ticks if info else 0, now)
            self.liveness.watch(rec)
        self.table.identity(rec, msg, addr, now)
        return rec

    def _inject_xid(self, msg: InjectXid) -> None:
        sim = getattr(self.agent, "simulated", None)
        gpu, code = msg.gpu, msg.xid
        if sim is None:
            self.table.event(
                "log",
                None,
                message=f"XID {code} injection on GPU {gpu} refused: "
                "this agent does not simulate GPUs",
            )
            return
        try:
            sim.inject_xid(gpu, code, msg.message or f"injected XID {code}")
        except (ValueError, IndexError) as exc:
            self.table.event("log", None, message=f"XID {code} injection on GPU {gpu}: {exc}")

    # --- queries and actions (for the executor) -----------------------------------------

    def rank_statuses(self) -> list[RankStatus]:
        """The rank table (see RankTable.statuses)."""
        with self.cond:
            return self.table.statuses(self._thresholds)

    def _thresholds(self, rec: RankRecord) -> dict[str, float]:
        """trainguard's own timeouts for a rank (wire.Timeouts): its hang threshold now,
        once its pace is known, the first-step allowance, the launcher restart's wait."""
        watch = self.liveness
        out = {"first_step_s": max(watch.hang_min_s, watch.hang_first_step_s)}
        if len(rec.intervals) >= 2:
            out["hang_s"] = min(round(watch.hang_threshold(rec), 3), MAX_TIMEOUT_S)
        if self.restart_wait_s is not None:
            out["restart_wait_s"] = self.restart_wait_s
        return out

    def wait_settled(self) -> None:
        """Return once `settle_s` has passed since the server started: the ranks already
        running then have registered again (their heartbeat is once a second)."""
        while (left := self._listing_from - time.monotonic()) > 0 and not self._stop.is_set():
            self._stop.wait(min(left, 0.5))

    def listed_ranks(self) -> list[RankStatus] | None:
        """The rank table for the uplink's batches; None (no list) for the first
        `settle_s` after the server started, while the ranks already running (after an
        agent restart) register again with their next heartbeat: the backend reads a
        listed table as all this node has, and a rank absent from it for long as gone
        (ingest's unlisted ranks)."""
        if time.monotonic() < self._listing_from:
            return None
        return self.rank_statuses()

    def _live_parents(self) -> list[tuple[str, int]]:
        """(job, the process that started it) of every live rank here."""
        with self.cond:
            return [(r.job, r.ppid) for r in self.table.ranks.values() if r.alive]

    def listed_launchers(self, force: bool = False) -> list[LauncherStatus] | None:
        """The node's launchers when due for a batch (LauncherWatch.provider); none in
        the first `settle_s`, while the ranks already running register again (a launcher
        of theirs would read as a spare)."""
        if time.monotonic() < self._listing_from:
            return None
        return self.launchers.provider(force)

    def job_ranks(self, job: str, alive_only: bool = True) -> list[RankRecord]:
        """The records of a job's ranks (call under `cond` when consistency matters)."""
        return self.table.job_ranks(job, alive_only)

    def wait_until(self, fn: Callable[[], T | None], timeout: float) -> T | None:
        """Evaluate fn under the table lock after every change until it returns non-None."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                value = fn()
                if value is not None:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(min(left, self.liveness.check_interval))

    def request_restart(self, job: str, request_id: str, reason: str = "") -> list[int]:
        """Send an in-process restart request to the job's live ranks; returns their pids."""
        data = encode(Restart(job=job, request_id=request_id, reason=reason))
        sent = []
        with self.cond:
            targets = [(r.pid, r.addr) for r in self.job_ranks(job) if r.addr is not None]
        for pid, addr in targets:
            try:
                assert self._sock is not None
                self._sock.sendto(data, socket.MSG_DONTWAIT, addr)
                sent.append(pid)
            except OSError:
                continue
        return sent
