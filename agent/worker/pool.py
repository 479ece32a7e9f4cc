"""The warm pool: `python -m trainguard.worker.pool --socket PATH --size K [--preload M,...]`.

One process per node, started and supervised by the agent (`trainguard agent --pool K`,
trainguard.worker.supervisor). It imports what a worker spends its start-up on (torch,
torch.distributed, torch.distributed.checkpoint, and when present torch._dynamo, which
torch.optim imports at an optimizer's first use, NVRx's fault_tolerance and inprocess,
trainguard.sdk, and the `--preload` modules), never initialises CUDA,
NCCL or a process group, and forks K idle interpreters from its one thread
(trainguard.worker.child). It listens on a Unix SOCK_SEQPACKET socket (mode 0600: its own
user's workers only) beside the agent's:

- `run` (from a shim, with its fds 0-2): checked (the same user, the same Python and
  interpreter flags), then handed with the connection to an idle interpreter, which
  answers the shim itself; none idle: `busy`, and the shim runs cold. A new interpreter
  is forked in the background for each one taken.
- `stats`: the pool's pid, size, idle and busy pids and counters, as JSON.

When a worker it forked ends, the pool sends the shim the status (`exit`, with `code` or
`signal`) from waitid(WNOWAIT), and reaps the worker `REAP_DELAY_S` later, so the agent's
exit watch still reads the code from the zombie. A `--preload` module that does not
import, or imports that start a thread (a fork would lose it), end the pool at start with
one line and exit code 3: no pool, workers run cold.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import selectors
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from trainguard.protocol import pool as messages
from trainguard.worker import ignore_pynvml_deprecation
from trainguard.worker.child import idle, set_pdeathsig
from trainguard.worker.shim import interpreter

BASE_MODULES = ("torch", "torch.distributed", "torch.distributed.checkpoint")
OPTIONAL_MODULES = (
    # torch.optim imports it at an optimizer's first use (its methods are wrapped to
    # disable dynamo): 0.6-1.2 s here, between a new worker's process group and its
    # checkpoint load
    "torch._dynamo",
    "nvidia_resiliency_ext.fault_tolerance",
    "nvidia_resiliency_ext.inprocess",
    "trainguard.sdk",
)
SETUP_ERROR = 3  # the supervisor does not restart a pool that exits with it
REAP_DELAY_S = 1.0
POLL_S = 0.1  # without pidfds: how often exits are looked for


class PoolSetupError(RuntimeError):
    """The pool cannot serve; str() is its one line."""


def preload(extra: list[str], base: tuple[str, ...] = BASE_MODULES) -> list[str]:
    """Import the worker's start-up; the modules imported. PoolSetupError (one line) for
    a module of the base set or of `extra` that does not import."""
    done = []
    for name in (*base, *extra):
        try:
            importlib.import_module(name)
        except BaseException as exc:
            which = "--preload module" if name in extra else "module"
            raise PoolSetupError(
                f"{which} {name} does not import ({type(exc).__name__}: {exc})"
            ) from None
        done.append(name)
    for name in OPTIONAL_MODULES if base else ():
        with contextlib.suppress(Exception):
            importlib.import_module(name)
            done.append(name)
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:
        raise PoolSetupError(
            f"the preloaded modules started {threads - 1} thread(s); a fork would lose them"
        )
    return done


@dataclass
class Child:
    pid: int
    ctl: socket.socket | None  # the pool's end of the control socket while idle
    pidfd: int | None
    conn: socket.socket | None = None  # the shim's connection once busy
    started: float = field(default_factory=time.time)
    status: tuple[str, int] | None = None


class Pool:
    def __init__(self, path: str, size: int, modules: list[str]) -> None:
        self.path, self.size, self.modules = path, size, modules
        self.pid = os.getpid()
        self.children: dict[int, Child] = {}
        self.zombies: list[tuple[float, int]] = []
        self.served = self.busy_answers = self.refused = 0
        self.python = msgspec.convert(interpreter(), messages.Interpreter)
        self.sel = selectors.DefaultSelector()
        self.stopping = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self.listener = self._bind(path)

    @staticmethod
    def _bind(path: str) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(path)
            raise PoolSetupError(f"a pool already listens on {path}")
        except (FileNotFoundError, ConnectionRefusedError):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # stale
        finally:
            probe.close()
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        old = os.umask(0o177)
        try:
            s.bind(path)
        finally:
            os.umask(old)
        s.listen(128)
        return s

    # --- the loop -------------------------------------------------------------------
    def serve(self) -> None:
        signal.set_wakeup_fd(self._wake_w)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, self._on_signal)
        self.sel.register(self.listener, selectors.EVENT_READ, "listen")
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        print(
            f"trainguard worker pool: {self.size} warm interpreters on {self.path} "
            f"(pid {self.pid}; preloaded {', '.join(self.modules)})",
            file=sys.stderr,
            flush=True,
        )
        try:
            while not self.stopping:
                short = self._idle_count() < self.size
                polling = any(c.pidfd is None for c in self.children.values())
                timeout = 0.0 if short else self._timeout(polling)
                events = self.sel.select(timeout)
                for key, _ in events:
                    self._dispatch(key)
                if not events and short and not self.stopping:
                    self._fork()  # refill only when nothing else waits
                self._poll_exits(polling)
                self._reap_due()
        finally:
            self.close()

    def _timeout(self, polling: bool) -> float | None:
        t = [POLL_S] if polling else []
        if self.zombies:
            t.append(max(0.0, self.zombies[0][0] - time.monotonic()))
        return min(t) if t else None

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def _idle_count(self) -> int:
        return sum(1 for c in self.children.values() if c.ctl is not None)

    def _dispatch(self, key: selectors.SelectorKey) -> None:
        if key.data == "listen":
            with contextlib.suppress(BlockingIOError, InterruptedError):
                conn, _ = self.listener.accept()
                self._request(conn)
        elif key.data == "wake":
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 512)
        elif isinstance(key.data, tuple):  # ("exit" | "ctl", pid): a pidfd, or EOF of
            self._exited(key.data[1])  # an idle one's control socket (it died)

    # --- requests -------------------------------------------------------------------
    def _request(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            conn.settimeout(1.0)
            data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 8)
            try:
                msg: messages.ToPool | None = messages.decode_to_pool(data)
            except messages.PoolError:
                msg = None
            peer_uid = struct.unpack(
                "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            )[1]
            if peer_uid != os.getuid():
                self._answer(conn, messages.Refused(why="belongs to another user"))
                self.refused += 1
            elif isinstance(msg, messages.StatsRequest):
                self._answer(conn, self.stats())
            elif msg is None:
                self._answer(conn, messages.Refused(why="got an unknown request"))
            elif (why := self._incompatible(msg.python)) is not None:
                self._answer(conn, messages.Refused(why=why))
                self.refused += 1
            elif (child := self._take()) is None:
                self._answer(conn, messages.Busy(why="is busy (no idle interpreter)"))
                self.busy_answers += 1
            else:
                self._hand(child, data, conn, fds)
                self.served += 1
                conn = None  # type: ignore[assignment]  # kept by the busy child's record
        except (OSError, ValueError) as exc:
            print(f"trainguard worker pool: a request failed: {exc}", file=sys.stderr)
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            if conn is not None:
                conn.close()

    @staticmethod
    def _answer(conn: socket.socket, msg: msgspec.Struct) -> None:
        with contextlib.suppress(OSError):
            conn.send(messages.encode(msg))

    def _incompatible(self, theirs: messages.Interpreter) -> str | None:
        ours = self.python
        if theirs.prefix != ours.prefix or theirs.version != ours.version:
            return (
                f"runs another Python ({ours.executable}, prefix {ours.prefix}; the "
                f"worker's prefix is {theirs.prefix})"
            )
        if theirs.flags != ours.flags or theirs.hashseed != ours.hashseed:
            return "runs with other interpreter flags or PYTHONHASHSEED"
        return None

    def _take(self) -> Child | None:
        for c in self.children.values():
            if c.ctl is not None:
                return c
        return None

    def _hand(self, child: Child, data: bytes, conn: socket.socket, fds: list[int]) -> None:
        ctl = child.ctl
        assert ctl is not None
        child.ctl = None
        child.conn = conn
        child.started = time.time()
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(ctl)
        try:
            socket.send_fds(ctl, [data], [conn.fileno(), *fds])
        finally:
            ctl.close()

    # --- children -------------------------------------------------------------------
    def _fork(self) -> None:
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # the warm interpreter
            try:
                parent_end.close()
                self._close_in_child()
                idle(child_end, self.pid)
            finally:
                os._exit(70)
        child_end.close()
        pidfd: int | None = None
        with contextlib.suppress(OSError, AttributeError):
            pidfd = os.pidfd_open(pid)
        c = Child(pid, parent_end, pidfd)
        self.children[pid] = c
        self.sel.register(parent_end, selectors.EVENT_READ, ("ctl", pid))
        if pidfd is not None:
            self.sel.register(pidfd, selectors.EVENT_READ, ("exit", pid))

    def _close_in_child(self) -> None:
        """A warm interpreter keeps none of the pool's descriptors: no other shim's
        connection (that shim would never see EOF), no listener, no epoll set."""
        signal.set_wakeup_fd(-1)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            self.sel.close()
        self.listener.close()
        for c in self.children.values():
            for s in (c.ctl, c.conn):
                if s is not None:
                    s.close()
            if c.pidfd is not None:
                with contextlib.suppress(OSError):
                    os.close(c.pidfd)

    def _poll_exits(self, polling: bool) -> None:
        if polling:
            for pid, c in list(self.children.items()):
                if c.pidfd is None:
                    self._exited(pid)

    def _exited(self, pid: int) -> None:
        c = self.children.get(pid)
        if c is None or c.status is not None:
            return
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
        else:
            if info is None:
                return  # not yet
        if info is None:
            status = ("code", 1)
        elif info.si_code == os.CLD_EXITED:
            status = ("code", info.si_status)
        else:
            status = ("signal", info.si_status)
        c.status = status
        if c.pidfd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(c.pidfd)
            os.close(c.pidfd)
            c.pidfd = None
        if c.ctl is not None:  # an idle one died
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(c.ctl)
            c.ctl.close()
            c.ctl = None
        if c.conn is not None:
            end = (
                messages.Exit(pid=pid, signal=status[1])
                if status[0] == "signal"
                else messages.Exit(pid=pid, code=status[1])
            )
            with contextlib.suppress(OSError):
                c.conn.send(messages.encode(end))
            c.conn.close()
            c.conn = None
            self.zombies.append((time.monotonic() + REAP_DELAY_S, pid))
        else:
            self._reap(pid)

    def _reap_due(self) -> None:
        now = time.monotonic()
        while self.zombies and self.zombies[0][0] <= now:
            _, pid = self.zombies.pop(0)
            self._reap(pid)

    def _reap(self, pid: int) -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        self.children.pop(pid, None)

    def stats(self) -> messages.Stats:
        live = [c for c in self.children.values() if c.status is None]
        return messages.Stats(
            pid=self.pid,
            size=self.size,
            idle=[c.pid for c in live if c.ctl is not None],
            busy=[c.pid for c in live if c.ctl is None],
            served=self.served,
            busy_answers=self.busy_answers,
            refused=self.refused,
            preloaded=list(self.modules),
        )

    def close(self) -> None:
        """Idle interpreters end (their control socket closes); workers go on running."""
        with contextlib.suppress(OSError):
            self.listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        for c in list(self.children.values()):
            if c.ctl is not None:
                c.ctl.close()
                c.ctl = None
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.pid, signal.SIGKILL)
            if c.conn is not None:
                # the worker outlives the pool; its shim gets no status (exits 1 then)
                c.conn.close()
                c.conn = None
        for c in list(self.children.values()):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(c.pid, os.WNOHANG)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--socket", required=True)
    p.add_argument("--size", type=int, default=2)
    p.add_argument("--preload", default="", help="more modules to import, comma-separated")
    p.add_argument(
        "--only",
        default=None,
        help="import these instead of torch, DCP and NVRx (tests: a torch-free pool)",
    )
    a = p.parse_args(argv)
    set_pdeathsig(signal.SIGTERM)  # the agent that started us is gone: so are we
    ignore_pynvml_deprecation()  # torch and NVRx import pynvml: here and in every worker
    # torch starts an OpenMP thread at import unless limited to one, and a fork keeps
    # only the forking thread; each worker sets its own count (trainguard.worker.child)
    os.environ["OMP_NUM_THREADS"] = "1"
    extra = [m.strip() for m in a.preload.split(",") if m.strip()]
    try:
        if a.size < 1:
            raise PoolSetupError(f"--size must be at least 1, got {a.size}")
        base = BASE_MODULES if a.only is None else tuple(m for m in a.only.split(",") if m)
        modules = preload(extra, base)
        pool = Pool(a.socket, a.size, modules)
    except PoolSetupError as exc:
        print(f"trainguard worker pool: {exc}; no pool, workers run cold", file=sys.stderr)
        return SETUP_ERROR
    pool.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
