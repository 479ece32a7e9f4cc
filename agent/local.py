"""The agent's side of the SDK channel: a Unix datagram socket the training ranks talk to.

`LocalServer(agent)` is an agent component (start/stop). It keeps the table of this node's
training ranks (pid, rank, local rank, world size, attempt, iteration, last step, last
heartbeat), turns SDK messages into wire records in `agent.outbox`, and watches the ranks:

- a rank's process is gone (or a zombie waiting to be reaped): an urgent `rank_exit` event
  at once, with the exit code or signal when /proc still shows it;
- heartbeats continue but no step completes for longer than
  max(hang_min_s, hang_factor x the rank's recent step interval): an urgent `hang` event;
- the pid is alive but heartbeats stopped: an urgent `heartbeat_lost` event.

The loop sleeps until something happens: a datagram, a rank's exit (a pidfd per rank,
`os.pidfd_open`, readable once the process has exited), or the next instant a clock check
can fire (a hang or heartbeat deadline, computed from the rank table). Where pidfds are
unavailable (pre-5.3 kernels, seccomp), ranks are polled in /proc every `check_interval`.

The socket: the configured `socket_path` (TRAINGUARD_AGENT_SOCKET), else the first
well-known place whose folder this agent can create (`agent.sdk.socket_candidates`, the
list the SDK tries in the same order); a live agent already there is not displaced.

Each rank's identity messages carry what it declared (launcher, in_process, display name);
they go on every RankStatus. A rank's exit is clean only with exit code 0 (read from the
zombie, else as the rank said) and no uncaught exception reported.

The executor uses `request_restart` to reach the ranks and `wait_until` to follow them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import re
import selectors
import socket
import stat
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from trainguard.protocol.wire import Event, RankStatus, StepReport
from trainguard.sdk import LAUNCHERS, SOCKET_DIRS_ENV, probe_socket, socket_candidates, wire_name

T = TypeVar("T")

log = logging.getLogger(__name__)

_SLACK_S = 0.01  # wake this long after a deadline, so the check finds it passed
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")  # the wire's Name


def _wire_name(value: Any) -> str | None:
    return value if isinstance(value, str) and _NAME.match(value) else None


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


@dataclass
class ProcInfo:
    state: str  # one letter, "Z" for a zombie
    start_ticks: int
    exit_status: int  # waitpid-style status, meaningful for a zombie


def proc_info(pid: int) -> ProcInfo | None:
    """What /proc says about a pid; None when the process is gone."""
    try:  # os.open/os.read: three system calls, where open() adds fstat, ioctl, lseeks
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            raw = os.read(fd, 4096).decode(errors="replace")
        finally:
            os.close(fd)
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2 :].split()  # fields after "pid (comm)"
    try:
        return ProcInfo(state=rest[0], start_ticks=int(rest[19]), exit_status=int(rest[49]))
    except (IndexError, ValueError):
        return ProcInfo(state=rest[0] if rest else "?", start_ticks=0, exit_status=0)


@dataclass
class RankRecord:
    pid: int
    job: str
    rank: int
    local_rank: int = 0
    world_size: int = 1
    attempt: int = 0
    iteration: int = 0
    ppid: int = 0
    addr: Any = None
    start_ticks: int = 0
    registered_at: float = 0.0
    last_heartbeat: float | None = None
    last_step: int | None = None
    last_step_end: float | None = None
    steps_this_iteration: int = 0
    first_step_end_this_iteration: float | None = None
    iteration_started_at: float = 0.0
    progress_mono: float = 0.0  # monotonic time of the last step (or of the iteration start)
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=16))
    alive: bool = True
    exited_at: float | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    clean_exit: bool = False  # said so in its bye; at exit: exit code 0, nothing uncaught
    said_bye: bool = False
    uncaught: str | None = None  # an exception nothing caught (its type)
    said_exit_code: int | None = None  # the exit code the SDK knew (sys.exit)
    launcher: str | None = None
    in_process: bool | None = None
    display_name: str | None = None
    hang_reported: bool = False
    in_checkpoint: bool = False
    restarting: bool = False  # an exception was reported; no hang checks until re-entry
    finished: bool = False
    heartbeat_lost_reported: bool = False
    restart_raised: dict[str, float] = field(default_factory=dict)  # request id -> ts
    pidfd: int | None = None  # readable once the process has exited; None: poll /proc


class LocalServer:
    def __init__(
        self,
        agent: Any,
        socket_path: str | None = None,
        check_interval: float = 0.1,
        hang_factor: float = 10.0,
        hang_min_s: float = 2.0,
        hang_first_step_s: float = 120.0,
        heartbeat_timeout_s: float = 10.0,
        keep_exited_s: float = 60.0,
    ) -> None:
        self.agent = agent
        cfg = getattr(agent, "config", None)
        configured = socket_path or getattr(cfg, "socket_path", None)
        self.socket_path = str(configured) if configured else well_known_socket()
        # The first well-known place (/run/trainguard/agent.sock, also where the systemd
        # unit and the DaemonSet put it): ranks of every user send there, so the socket is
        # writable by all, whatever the agent's umask; its folder decides who reaches it.
        self.shared_socket = self.socket_path == socket_candidates()[0]
        self.check_interval = check_interval
        self.hang_factor = hang_factor
        self.hang_min_s = hang_min_s
        self.hang_first_step_s = hang_first_step_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.keep_exited_s = keep_exited_s
        self.ranks: dict[int, RankRecord] = {}
        self._by_addr: dict[Any, int] = {}
        self._attempts: dict[str, int] = {}
        self.unknown_messages = 0
        self.wakeups = 0  # times the loop woke up (datagrams, exits, deadlines, stop)
        self.cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._sel: selectors.BaseSelector | None = None
        self._wake_r = self._wake_w = -1
        self._next_check = math.inf  # monotonic time of the next clock check

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
        self.agent.outbox.ranks_provider = self.rank_statuses
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
            for rec in self.ranks.values():
                self._unwatch(rec)
        if self._sel is not None:
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
        sock, sel = self._sock, self._sel
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
                    rec = self._message(data, addr)
                    if rec is not None:
                        touched.append(rec)
                if drained:
                    # The socket is empty, so everything an exited rank sent (its steps,
                    # its "bye") is in the table before its exit is reported; otherwise the
                    # (level-triggered) pidfd is seen again on the next turn.
                    now = time.time()
                    for rec in exited:
                        self._pidfd_exited(rec, now)
                mono = time.monotonic()
                if mono >= self._next_check:
                    self._next_check = self._check(mono)
                elif touched:
                    # a message can only bring its own rank's deadline closer
                    now = time.time()
                    for rec in {id(r): r for r in touched}.values():
                        self._next_check = min(self._next_check, self._check_rank(rec, mono, now))
                self.cond.notify_all()

    def _receive(
        self, sock: socket.socket, limit: int = 1024
    ) -> tuple[list[tuple[bytes, Any]], bool]:
        """The datagrams waiting on the socket (at most `limit`); True when it is empty."""
        out: list[tuple[bytes, Any]] = []
        while len(out) < limit:
            try:
                out.append(sock.recvfrom(65536))
            except (BlockingIOError, InterruptedError):
                return out, True
            except OSError:
                if self._stop.is_set():
                    return out, True
                raise
        return out, False

    def _message(self, data: bytes, addr: Any) -> RankRecord | None:
        """Handle one datagram (under `cond`); the rank it was about, if any."""
        try:
            msg = json.loads(data)
        except ValueError:
            self.unknown_messages += 1
            return None
        if not isinstance(msg, dict):
            return None
        try:
            return self._handle(msg, addr)
        except (KeyError, TypeError, ValueError):  # a malformed message
            self.unknown_messages += 1
            return None

    # --- exit watch ---------------------------------------------------------------------

    def _watch(self, rec: RankRecord) -> None:
        """Open a pidfd for the rank (in the loop thread): its exit then wakes the loop.
        Without one (no pidfd_open here, or the process is already gone) the rank is
        polled in /proc every check_interval."""
        if self._sel is None or rec.pidfd is not None:
            return
        try:
            fd = os.pidfd_open(rec.pid)
        except ProcessLookupError:
            return  # gone already: the next /proc check reports it
        except (AttributeError, OSError) as exc:
            log.debug("no pidfd for pid %d (%s): polling /proc", rec.pid, exc)
            return
        rec.pidfd = fd
        self._sel.register(fd, selectors.EVENT_READ, rec)

    def _unwatch(self, rec: RankRecord) -> None:
        if rec.pidfd is None:
            return
        if self._sel is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(rec.pidfd)
        os.close(rec.pidfd)
        rec.pidfd = None

    def _pidfd_exited(self, rec: RankRecord, now: float) -> None:
        """The rank's pidfd became readable: the process has exited. The exit status is
        read from /proc while the process is a zombie its parent has not reaped."""
        self._unwatch(rec)
        if not rec.alive:
            return
        self._exited(rec, self._own_zombie(rec, proc_info(rec.pid)), now)

    @staticmethod
    def _pid_reused(rec: RankRecord, info: ProcInfo) -> bool:
        """`info` is about another process than the rank's, on its reused pid."""
        return bool(rec.start_ticks) and info.start_ticks != rec.start_ticks

    @staticmethod
    def _own_zombie(rec: RankRecord, info: ProcInfo | None) -> ProcInfo | None:
        """`info` when it shows the rank's own process as a zombie (its exit status is
        there until the parent reaps it), else None."""
        if info is None or info.state != "Z" or LocalServer._pid_reused(rec, info):
            return None
        return info

    def _put_event(
        self,
        kind: str,
        rec: RankRecord | None,
        /,
        urgent: bool = False,
        message: str = "",
        ts: float | None = None,
        **data: Any,
    ) -> None:
        self.agent.outbox.put_event(
            Event(
                kind=kind,  # type: ignore[arg-type]
                ts=ts if ts is not None else time.time(),
                job=rec.job if rec else None,
                rank=rec.rank if rec else None,
                message=message[:4096],
                data={k: v for k, v in data.items() if v is not None},
            ),
            urgent=urgent,
        )

    def _handle(self, msg: dict[str, Any], addr: Any) -> RankRecord | None:
        kind = msg.get("t")
        if kind in ("hello", "heartbeat", "iteration", "bye"):
            return self._identity(msg, addr)
        if kind == "inject_xid":
            self._inject_xid(msg)
            return None
        pid = self._by_addr.get(addr)
        rec = self.ranks.get(pid) if pid is not None else None
        if rec is None:
            self.unknown_messages += 1
            return None
        if kind == "steps":
            for item in msg["v"]:
                n, a, b = item[:3]
                c = float(item[3]) if len(item) > 3 and item[3] is not None else None
                self._step(rec, int(n), float(a), float(b), c)
        elif kind == "step":
            self._step(rec, int(msg["s"]), float(msg["a"]), float(msg["b"]))
        elif kind == "interrupted":
            rec.restarting = True
        elif kind == "exception":
            for other in self.job_ranks(rec.job):
                other.restarting = True
            uncaught = msg.get("uncaught") is True
            if uncaught:
                rec.uncaught = str(msg.get("type"))[:256]
            self._put_event(
                "exception",
                rec,
                urgent=True,
                ts=msg.get("ts"),
                message=f"{msg.get('type')}: {msg.get('message')}\n{msg.get('traceback', '')}",
                type=str(msg.get("type"))[:256],
                step=msg.get("step"),
                pid=rec.pid,
                uncaught=uncaught or None,
                thread=str(msg["thread"])[:256] if msg.get("thread") else None,
            )
        elif kind == "checkpoint":
            phase = str(msg.get("phase", ""))
            rec.in_checkpoint = phase.endswith("_start")
            if not rec.in_checkpoint:
                rec.progress_mono = time.monotonic()
            self._put_event(
                "checkpoint",
                rec,
                ts=msg.get("ts"),
                message=f"checkpoint {msg.get('phase')} step {msg.get('step')}",
                phase=str(msg.get("phase"))[:64],
                step=msg.get("step"),
                blocking_s=msg.get("blocking_s"),
                ok=msg.get("ok"),
            )
        elif kind == "restart_raised":
            rec.restart_raised[str(msg.get("id", ""))] = float(msg.get("ts") or time.time())
            self._put_event(
                "restart",
                rec,
                ts=msg.get("ts"),
                message="restart raised in rank",
                phase="raised",
                request=str(msg.get("id", ""))[:64],
            )
        elif kind == "restart_received":
            pass
        elif kind == "finished":
            rec.finished = True
        elif kind == "log":
            raw = msg.get("data")
            data: dict[str, Any] = raw if isinstance(raw, dict) else {}
            scalars: dict[str, Any] = {
                str(k)[:256]: v
                for k, v in list(data.items())[:32]
                if isinstance(v, str | int | float | bool) and k not in ("ts", "message", "urgent")
            }
            self._put_event(
                "log", rec, ts=msg.get("ts"), message=str(msg.get("message", "")), **scalars
            )
        else:
            self.unknown_messages += 1
        return rec

    def _identity(self, msg: dict[str, Any], addr: Any) -> RankRecord:
        pid = int(msg["pid"])
        now = time.time()
        rec = self.ranks.get(pid)
        info: ProcInfo | None = None
        if rec is None or rec.pidfd is None or msg.get("t") == "hello":
            # A watched live rank is known to be the same process: its pidfd would have
            # fired (a reused pid starts with "hello"); others are checked in /proc.
            info = proc_info(pid)
            if rec is not None and info is not None and self._pid_reused(rec, info):
                self._unwatch(rec)  # the pid was reused by a new process
                if rec.alive:
                    self._exited(rec, None, now)
                rec = None
        if rec is None:
            rec = RankRecord(
                pid=pid,
                job=wire_name(str(msg["job"])),  # an old SDK let "/" through
                rank=int(msg["rank"]),
                start_ticks=info.start_ticks if info else 0,
                registered_at=now,
                iteration_started_at=float(msg.get("ts") or now),
                progress_mono=time.monotonic(),
            )
            self.ranks[pid] = rec
            self._watch(rec)
            rec.local_rank = int(msg.get("local_rank", 0))
            rec.world_size = int(msg.get("world_size", 1))
            rec.attempt = int(msg.get("attempt", 0))
            rec.iteration = int(msg.get("iteration", 0))
            self._declared(rec, msg)
            self._put_event(
                "rank_start",
                rec,
                message=f"rank {rec.rank} pid {pid} registered",
                pid=pid,
                local_rank=rec.local_rank,
                world_size=rec.world_size,
                attempt=rec.attempt,
                iteration=rec.iteration,
                launcher=rec.launcher,
                in_process=rec.in_process,
                display_name=rec.display_name,
            )
            known = self._attempts.get(rec.job)
            if known is not None and rec.attempt > known:
                self._put_event(
                    "restart",
                    rec,
                    message=f"launcher restart: attempt {rec.attempt}",
                    level="launcher",
                    attempt=rec.attempt,
                )
            if known is None or rec.attempt > known:
                self._attempts[rec.job] = rec.attempt
        if addr is not None:
            if rec.addr is not None and rec.addr != addr:
                self._by_addr.pop(rec.addr, None)
            rec.addr = addr
            self._by_addr[addr] = pid
        iteration = int(msg.get("iteration", rec.iteration))
        # Within one process the Wrapper's iteration only grows: a lower one is a message
        # sent before the restart that arrives after it (a heartbeat racing the
        # iteration message), not a restart.
        if iteration > rec.iteration:
            self._put_event(
                "restart",
                rec,
                message=f"in-process restart: iteration {iteration}",
                level="in_process",
                iteration=iteration,
                previous=rec.iteration,
            )
            rec.iteration = iteration
            rec.steps_this_iteration = 0
            rec.first_step_end_this_iteration = None
            rec.iteration_started_at = float(msg.get("ts") or now)  # the rank's clock
            rec.progress_mono = time.monotonic()
            rec.intervals.clear()
            rec.last_step_end = None
            rec.hang_reported = False
            rec.restarting = False
        rec.rank = int(msg.get("rank", rec.rank))
        rec.world_size = int(msg.get("world_size", rec.world_size))
        rec.ppid = int(msg.get("ppid", rec.ppid))
        rec.last_heartbeat = float(msg.get("ts") or now)
        rec.heartbeat_lost_reported = False
        self._declared(rec, msg)
        if msg.get("t") == "bye":
            rec.said_bye = True
            if msg.get("uncaught"):
                rec.uncaught = str(msg["uncaught"])[:256]
            code = msg.get("exit_code")
            if isinstance(code, int) and not isinstance(code, bool):
                rec.said_exit_code = code
            # an SDK before capabilities sends no "clean": its bye meant a clean exit
            rec.clean_exit = msg.get("clean") is not False and rec.uncaught is None
        return rec

    @staticmethod
    def _declared(rec: RankRecord, msg: dict[str, Any]) -> None:
        """What the rank declared (absent from an older SDK: unknown). A value the wire
        would refuse is dropped here, so one bad rank cannot get a batch refused."""
        if "launcher" in msg:
            rec.launcher = msg["launcher"] if msg["launcher"] in LAUNCHERS else None
        if "in_process" in msg:
            rec.in_process = msg["in_process"] if isinstance(msg["in_process"], bool) else None
        if "display_name" in msg:
            rec.display_name = _wire_name(msg["display_name"])

    def _step(
        self, rec: RankRecord, n: int, start: float, end: float, compute: float | None = None
    ) -> None:
        if rec.last_step_end is not None and end > rec.last_step_end:
            rec.intervals.append(end - rec.last_step_end)
        rec.last_step = n
        rec.last_step_end = end
        rec.steps_this_iteration += 1
        if rec.first_step_end_this_iteration is None and end >= rec.iteration_started_at:
            rec.first_step_end_this_iteration = end
        rec.progress_mono = time.monotonic()
        if rec.hang_reported:
            rec.hang_reported = False
            self._put_event("log", rec, message=f"rank {rec.rank} progresses again at step {n}")
        self.agent.outbox.put_step(
            StepReport(
                job=rec.job,
                rank=rec.rank,
                step=n,
                start=start,
                end=end,
                attempt=rec.attempt,
                iteration=rec.iteration,
                compute=compute if compute is not None and compute >= 0 else None,
            )
        )

    def _inject_xid(self, msg: dict[str, Any]) -> None:
        sim = getattr(self.agent, "simulated", None)
        gpu, code = int(msg.get("gpu", 0)), int(msg.get("xid", 0))
        text = str(msg.get("message") or f"injected XID {code}")
        if sim is None:
            self._put_event(
                "log",
                None,
                message=f"XID {code} injection on GPU {gpu} refused: "
                "this agent does not simulate GPUs",
            )
            return
        try:
            sim.inject_xid(gpu, code, text)
        except (ValueError, IndexError) as exc:
            self._put_event("log", None, message=f"XID {code} injection on GPU {gpu}: {exc}")

    # --- periodic checks ----------------------------------------------------------------

    def hang_threshold(self, rec: RankRecord) -> float:
        """A rank needs a few steps in an iteration before its pace is known; until then
        the (long) first-step allowance applies, covering process group setup and loads."""
        if len(rec.intervals) < 2:
            return max(self.hang_min_s, self.hang_first_step_s)
        return max(self.hang_min_s, self.hang_factor * statistics.median(rec.intervals))

    def _check(self, mono: float) -> float:
        """The clock checks of every rank; returns the monotonic time of the next one
        (inf: nothing to check until a message or an exit comes)."""
        now = time.time()
        next_t = math.inf
        for rec in list(self.ranks.values()):
            next_t = min(next_t, self._check_rank(rec, mono, now))
        return next_t

    def _check_rank(self, rec: RankRecord, mono: float, now: float) -> float:
        """One rank's checks (a /proc poll too when it has no pidfd); returns when it
        next needs checking, assuming nothing happens meanwhile. Steps, heartbeats and
        the end of a checkpoint only move that time later; a message that can bring it
        closer is about this rank, and the loop calls this for it."""
        pid = rec.pid
        if not rec.alive:
            if rec.exited_at is None:
                return math.inf
            if now - rec.exited_at > self.keep_exited_s:
                if self.ranks.get(pid) is rec:
                    del self.ranks[pid]
                    self._by_addr.pop(rec.addr, None)
                return math.inf
            return mono + (rec.exited_at + self.keep_exited_s - now) + _SLACK_S
        next_t = math.inf
        if rec.pidfd is None:
            info = proc_info(pid)
            if info is None or info.state in ("Z", "X") or self._pid_reused(rec, info):
                self._exited(rec, self._own_zombie(rec, info), now)
                return mono + self.keep_exited_s + _SLACK_S
            next_t = mono + self.check_interval
        hb_age = now - rec.last_heartbeat if rec.last_heartbeat else 0.0
        if hb_age > self.heartbeat_timeout_s:
            if not rec.heartbeat_lost_reported:
                rec.heartbeat_lost_reported = True
                self._put_event(
                    "heartbeat_lost",
                    rec,
                    urgent=True,
                    message=f"rank {rec.rank} pid {pid}: no heartbeat for {hb_age:.1f} s",
                    pid=pid,
                    age_s=round(hb_age, 3),
                )
            return next_t
        if rec.last_heartbeat:
            next_t = min(next_t, mono + (self.heartbeat_timeout_s - hb_age) + _SLACK_S)
        if rec.finished or rec.said_bye or rec.in_checkpoint or rec.restarting:
            return next_t
        stalled = mono - rec.progress_mono
        threshold = self.hang_threshold(rec)
        if stalled > threshold and not rec.hang_reported:
            rec.hang_reported = True
            self._put_event(
                "hang",
                rec,
                urgent=True,
                message=f"rank {rec.rank} pid {pid}: alive, heartbeating, no step "
                f"for {stalled:.1f} s (threshold {threshold:.1f} s)",
                pid=pid,
                last_step=rec.last_step,
                stalled_s=round(stalled, 3),
                threshold_s=round(threshold, 3),
            )
        if not rec.hang_reported:
            next_t = min(next_t, rec.progress_mono + threshold + _SLACK_S)
        return next_t

    def _exited(self, rec: RankRecord, zombie: ProcInfo | None, now: float) -> None:
        rec.alive = False
        rec.exited_at = now
        told = ""
        if zombie is not None:
            status = zombie.exit_status
            if status & 0x7F:
                rec.exit_signal = status & 0x7F
            else:
                rec.exit_code = (status >> 8) & 0xFF
        elif rec.said_exit_code is not None:  # reaped before /proc was read: as it said
            rec.exit_code, told = rec.said_exit_code, ", as the rank said"
        # Clean: exit code 0 and nothing uncaught; with no exit status, the rank's own bye.
        if rec.exit_signal is not None:
            rec.clean_exit = False
        elif rec.exit_code is not None:
            rec.clean_exit = rec.exit_code == 0 and rec.uncaught is None
        else:
            rec.clean_exit = rec.said_bye and rec.clean_exit
        how = (
            f"signal {rec.exit_signal}"
            if rec.exit_signal is not None
            else f"exit code {rec.exit_code}{told}"
            if rec.exit_code is not None
            else "exit status unknown"
        )
        if rec.uncaught is not None:
            how += f", uncaught {rec.uncaught}"
        self._put_event(
            "rank_exit",
            rec,
            urgent=True,
            message=f"rank {rec.rank} pid {rec.pid} exited ({how})",
            pid=rec.pid,
            exit_code=rec.exit_code,
            signal=rec.exit_signal,
            clean=rec.clean_exit,
            uncaught=rec.uncaught,
            last_step=rec.last_step,
        )

    # --- queries and actions (for the executor) -----------------------------------------

    def rank_statuses(self) -> list[RankStatus]:
        """The rank table; an exited process is listed only while no live process holds
        its (job, rank), so a restarted rank is not reported dead next to its successor."""
        with self.cond:
            live = {(r.job, r.rank) for r in self.ranks.values() if r.alive}
            recs = [r for r in self.ranks.values() if r.alive or (r.job, r.rank) not in live]
            return [
                RankStatus(
                    job=r.job,
                    rank=r.rank,
                    pid=r.pid,
                    local_rank=r.local_rank,
                    world_size=max(1, r.world_size),
                    attempt=r.attempt,
                    iteration=r.iteration,
                    last_heartbeat=r.last_heartbeat,
                    last_step=r.last_step,
                    alive=r.alive,
                    in_process=r.in_process,
                    launcher=r.launcher,  # type: ignore[arg-type]
                    display_name=r.display_name,
                )
                for r in recs
            ][:1024]

    def job_ranks(self, job: str, alive_only: bool = True) -> list[RankRecord]:
        """The records of a job's ranks (call under `cond` when consistency matters)."""
        return [r for r in self.ranks.values() if r.job == job and (r.alive or not alive_only)]

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
                self.cond.wait(min(left, self.check_interval))

    def request_restart(self, job: str, request_id: str, reason: str = "") -> list[int]:
        """Send an in-process restart request to the job's live ranks; returns their pids."""
        data = json.dumps({"t": "restart", "job": job, "id": request_id, "reason": reason}).encode()
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
