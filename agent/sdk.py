"""The in-training SDK: a few lines in a training script report to the node agent.

    from agent import sdk
    tg = sdk.attach()                  # job, rank, world size, attempt from the environment
    for n in range(steps):
        with tg.step(n):               # never blocks; raises RestartRequested at a boundary
            train_one_step()

Standard library only. Everything travels as one JSON datagram over a Unix socket
(TRAINGUARD_AGENT_SOCKET, default /tmp/trainguard-agent-<hostname>.sock). Sends are
non-blocking (MSG_DONTWAIT): when the agent is absent or its buffer is full the message is
dropped and counted, training never waits. The agent answers on the same socket (the SDK
binds an abstract address), which is how a restart request reaches the rank.

Restart requests (`in_process` from the agent) set a flag; the step hook raises
`RestartRequested` at the next step boundary. A rank that stays inside one step for longer
than `signal_after` seconds after the request gets SIGUSR1 through signal.pthread_kill; the
handler raises in the main thread. Both are ordinary exceptions in the training function,
so NVRx's inprocess.Wrapper restarts every rank. (PyThreadState_SetAsyncExc is never used:
NVRx's progress watchdog swallows such exceptions.)
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import re
import signal
import socket
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from typing import Any

__all__ = [
    "FLUSH_INTERVAL_S",
    "RestartRequested",
    "Session",
    "attach",
    "current",
    "default_socket_path",
]

_NAME_BAD = re.compile(r"[^A-Za-z0-9._:@/-]")

# Queued steps are sent at most this often. A step is sent at once when nothing was
# sent for this long (slow steps arrive as they end, so the agent's hang check sees
# them) and when it is the first of a generation (after attach, a new iteration or a
# raised restart: the agent's `resumed` waits for it).
FLUSH_INTERVAL_S = 1.0


class RestartRequested(Exception):
    """Raised inside the training function when the agent asked for an in-process restart."""


def default_socket_path() -> str:
    return os.environ.get(
        "TRAINGUARD_AGENT_SOCKET", f"/tmp/trainguard-agent-{socket.gethostname()}.sock"
    )


def _job_from_env() -> str:
    job = (
        os.environ.get("TRAINGUARD_JOB")
        or os.environ.get("TORCHELASTIC_RUN_ID")
        or os.environ.get("SLURM_JOB_ID")
        or "local"
    )
    job = _NAME_BAD.sub("-", job)[:128]
    return job if job[:1].isalnum() else "j" + job[:127]


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class _Compute:
    """Context manager adding a section's duration to the current step's compute time."""

    __slots__ = ("_s", "_t0")

    def __init__(self, session: Session) -> None:
        self._s = session
        self._t0 = 0.0

    def __enter__(self) -> _Compute:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        s = self._s
        s._compute = (s._compute or 0.0) + (time.perf_counter() - self._t0)


class _Step:
    """Context manager for one step; a class (not a generator) to keep it to a few µs."""

    __slots__ = ("_n", "_s", "_t0")

    def __init__(self, session: Session) -> None:
        self._s = session
        self._n = 0
        self._t0 = 0.0

    def __call__(self, n: int) -> _Step:
        self._n = n
        return self

    def __enter__(self) -> _Step:
        s = self._s
        if s._restart_pending:
            s._raise_restart()
        s._in_step = True
        s._compute = None
        self._t0 = time.time()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        s = self._s
        s._in_step = False
        if exc_type is None:
            s.step_done(self._n, self._t0, time.time(), s._compute)


class Session:
    """One training process attached to the node agent."""

    def __init__(
        self,
        job: str,
        rank: int,
        local_rank: int,
        world_size: int,
        attempt: int,
        socket_path: str,
        heartbeat_interval: float = 1.0,
        signal_after: float = 2.0,
        install_signal_handler: bool = True,
        flush_interval: float = FLUSH_INTERVAL_S,
    ) -> None:
        self.job = job
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.attempt = attempt
        self.iteration = 0
        self.pid = os.getpid()
        self.socket_path = socket_path
        self.heartbeat_interval = heartbeat_interval
        self.signal_after = signal_after
        self.sent = 0
        self.dropped = 0
        self.last_step: int | None = None
        self.restart_requests = 0
        self._restart_pending = False
        self._restart_reason = ""
        self._restart_id = ""
        self._in_step = False
        self._closed = threading.Event()
        self._forked = False
        # Steps are queued by the hook (an append, no system call) and sent by the
        # heartbeat thread every flush_interval, or at once when the hook sets _kick:
        # for a step ending at or after _flush_due (a flush interval after the last
        # send; 0 for the first step of a generation).
        # (step, start, end) or (step, start, end, compute seconds)
        self._steps: deque[tuple[float, ...]] = deque()
        self._compute: float | None = None
        self.flush_interval = min(flush_interval, heartbeat_interval)
        self._flush_due = 0.0
        self._kick = threading.Event()
        self.max_pending_steps = 100_000
        self._flush_lock = threading.Lock()
        self._main_ident = threading.main_thread().ident
        self._stepper = _Step(self)
        self._compute_cm = _Compute(self)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        # An abstract address (Linux): nothing to clean up, unique per process.
        self._sock.bind(f"\0trainguard-sdk-{self.pid}-{id(self):x}")
        self._sock.settimeout(0.5)
        self._signal_installed = False
        if install_signal_handler and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, self._on_signal)
            self._signal_installed = True
        self._send(self._identity("hello"))
        self._listener = threading.Thread(target=self._listen, name="tg-sdk-listen", daemon=True)
        self._listener.start()
        self._heart = threading.Thread(target=self._beat, name="tg-sdk-heartbeat", daemon=True)
        self._heart.start()
        atexit.register(self.close)
        # A forked child (NVRx's monitor process, data loader workers) is not this rank:
        # it must not report, and its exit must not say "bye" for the rank.
        os.register_at_fork(after_in_child=self._after_fork)

    # --- sending ----------------------------------------------------------------------

    def _send_bytes(self, data: bytes) -> None:
        if self._forked:
            return
        try:
            self._sock.sendto(data, socket.MSG_DONTWAIT, self.socket_path)
            self.sent += 1
        except OSError:  # no agent, agent gone, or its buffer full: drop and count
            self.dropped += 1

    def _send(self, msg: dict[str, Any]) -> None:
        self._send_bytes(json.dumps(msg, separators=(",", ":")).encode())

    def _identity(self, kind: str) -> dict[str, Any]:
        return {
            "t": kind,
            "job": self.job,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "attempt": self.attempt,
            "iteration": self.iteration,
            "pid": self.pid,
            "ppid": os.getppid(),
            "last_step": self.last_step,
            "dropped": self.dropped,
            "ts": time.time(),
        }

    # --- the step hook ----------------------------------------------------------------

    def step(self, n: int) -> _Step:
        """`with session.step(n):` around one training step (reuses one object)."""
        return self._stepper(n)

    def step_done(self, n: int, start: float, end: float, compute: float | None = None) -> None:
        """Report a completed step (epoch seconds; `compute`: seconds of this rank's own
        work in it, see `compute()`); raises RestartRequested when one is due."""
        self.last_step = n
        steps = self._steps
        if len(steps) >= self.max_pending_steps:  # the flusher is stuck: drop, count
            self.dropped += 1
        elif compute is None:
            steps.append((n, start, end))
        else:
            steps.append((n, start, end, compute))
        if end >= self._flush_due:
            self._flush_due = math.inf  # one kick; the send sets the next due time
            self._kick.set()
        if self._restart_pending:
            self._raise_restart()

    def compute(self) -> _Compute:
        """Mark the rank's own work inside a step, e.g. forward + backward but not the
        gradient all-reduce: `with tg.step(n): with tg.compute(): loss = fwd_bwd(batch)`.
        In synchronous training every rank's wall-clock step waits for the slowest rank,
        so straggler scores need this part. Sections of one step add up. (On a GPU,
        synchronise the stream before the section ends, or it times only the launches.)"""
        return self._compute_cm

    def check_restart(self) -> None:
        """Raise RestartRequested if the agent asked for a restart (for custom loops)."""
        if self._restart_pending:
            self._raise_restart()

    def _raise_restart(self) -> None:
        self._restart_pending = False
        self._flush_due = 0.0  # the re-entry's first step goes at once
        self._send({"t": "restart_raised", "id": self._restart_id, "ts": time.time()})
        raise RestartRequested(self._restart_reason or "restart requested by trainguard")

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Raise only inside a step: anywhere else (NVRx's own restart code, the checkpoint
        # writer) the flag stays set and the next step boundary raises.
        if self._restart_pending and self._in_step:
            self._in_step = False
            self._raise_restart()

    # --- reports ----------------------------------------------------------------------

    def report_exception(self, exc: BaseException, max_lines: int = 12) -> None:
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        text = "".join(lines)
        head = "\n".join(text.splitlines()[-max_lines:])
        self._send(
            {
                "t": "exception",
                "type": type(exc).__name__,
                "message": str(exc)[:1000],
                "traceback": head[-3000:],
                "step": self.last_step,
                "ts": time.time(),
            }
        )

    def report_interrupted(self, reason: str = "") -> None:
        """The training function is being torn down for a restart it did not cause (e.g.
        NVRx's RankShouldRestart): the agent stops hang checks until the rank re-enters."""
        self._send(
            {"t": "interrupted", "reason": reason[:500], "step": self.last_step, "ts": time.time()}
        )

    @contextlib.contextmanager
    def checkpoint(self, phase: str, step: int | None = None) -> Iterator[None]:
        """`with session.checkpoint("save", step):` measures the blocking time of a
        checkpoint save (or "restore") and reports its start and end."""
        t0 = time.time()
        self._send({"t": "checkpoint", "phase": f"{phase}_start", "step": step, "ts": t0})
        ok = False
        try:
            yield
            ok = True
        finally:
            t1 = time.time()
            self._send(
                {
                    "t": "checkpoint",
                    "phase": f"{phase}_end",
                    "step": step,
                    "ts": t1,
                    "blocking_s": round(t1 - t0, 6),
                    "ok": ok,
                }
            )

    def restart_iteration(
        self, iteration: int, rank: int | None = None, world_size: int | None = None
    ) -> None:
        """Report the Wrapper's restart iteration (and the rank it now has). A restart
        that happened clears a pending request: it has been served."""
        if iteration != self.iteration:
            self._restart_pending = False
        self.iteration = iteration
        if rank is not None:
            self.rank = rank
        if world_size is not None:
            self.world_size = world_size
        with self._flush_lock:  # the old iteration's queued steps go first
            self._drain_steps()
            self._send(self._identity("iteration"))
            self._flush_due = 0.0  # the new iteration's first step goes at once

    def finished(self) -> None:
        """No more steps will come (the agent stops watching this rank for hangs)."""
        self._send({"t": "finished", "step": self.last_step, "ts": time.time()})

    def inject_xid(self, gpu_index: int, code: int, message: str = "") -> None:
        """Ask the agent to inject a simulated XID (fault injection on simulated GPUs)."""
        self._send(
            {
                "t": "inject_xid",
                "gpu": gpu_index,
                "xid": code,
                "message": message,
                "ts": time.time(),
            }
        )

    def log(self, message: str, **data: Any) -> None:
        self._send({"t": "log", "message": message[:2000], "data": data, "ts": time.time()})

    # --- background threads -----------------------------------------------------------

    def _beat(self) -> None:
        """Send the queued steps every flush_interval (and when the hook kicks), the
        identity every heartbeat_interval; both on one clock, so when they coincide the
        agent gets the two datagrams back to back."""
        now = time.monotonic()
        next_flush = now + self.flush_interval
        next_beat = now + self.heartbeat_interval
        while True:
            kicked = self._kick.wait(max(0.0, min(next_flush, next_beat) - time.monotonic()))
            if self._closed.is_set():
                break
            if kicked:
                self._kick.clear()
                self._flush_steps()
                continue
            now = time.monotonic()
            if now >= next_flush:
                self._flush_steps()
                next_flush = _next_tick(next_flush, self.flush_interval, now)
            if now >= next_beat:
                self._send(self._identity("heartbeat"))
                next_beat = _next_tick(next_beat, self.heartbeat_interval, now)
        self._flush_steps()

    def flush(self) -> None:
        """Send the steps queued so far now (the heartbeat thread does it every
        flush_interval, and at once for a step that starts a generation or ends a flush
        interval after the last send; close() does it too)."""
        self._flush_steps()

    def _flush_steps(self) -> None:
        with self._flush_lock:
            self._drain_steps()

    def _drain_steps(self) -> None:
        """Send the queued steps, up to 1,000 per datagram (off the training thread).
        A lost datagram counts each of its steps as dropped. Callers hold _flush_lock, so
        steps and a new iteration reach the agent in the order they happened."""
        steps = self._steps
        if not steps:
            return
        while steps:
            chunk: list[tuple[float, ...]] = []
            while steps and len(chunk) < 1000:
                chunk.append(steps.popleft())
            body = ",".join(
                ("[%d,%.6f,%.6f]" if len(c) == 3 else "[%d,%.6f,%.6f,%.6f]") % c for c in chunk
            )
            if self._forked:
                return
            before = self.dropped
            self._send_bytes(b'{"t":"steps","v":[' + body.encode() + b"]}")
            if self.dropped != before:
                self.dropped += len(chunk) - 1
        self._flush_due = time.time() + self.flush_interval

    def _listen(self) -> None:
        while not self._closed.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                msg = json.loads(data)
            except ValueError:
                continue
            if msg.get("t") == "restart" and msg.get("job") in (None, self.job):
                self._request_restart(str(msg.get("id", "")), str(msg.get("reason", "")))

    def _request_restart(self, request_id: str, reason: str) -> None:
        self.restart_requests += 1
        self._restart_id = request_id
        self._restart_reason = reason
        self._restart_pending = True
        self._send({"t": "restart_received", "id": request_id, "ts": time.time()})
        if self._signal_installed and self._main_ident is not None:
            threading.Thread(target=self._signal_if_stuck, name="tg-sdk-nudge", daemon=True).start()

    def _signal_if_stuck(self) -> None:
        """A rank that does not reach a step boundary within signal_after gets SIGUSR1."""
        deadline = time.monotonic() + self.signal_after
        while self._restart_pending and not self._closed.is_set():
            if time.monotonic() >= deadline:
                if self._in_step and self._main_ident is not None:
                    signal.pthread_kill(self._main_ident, signal.SIGUSR1)
                return
            time.sleep(0.01)

    def _after_fork(self) -> None:
        self._forked = True
        self._closed.set()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._kick.set()  # the heartbeat thread ends
        self._flush_steps()
        self._send(self._identity("bye"))
        with contextlib.suppress(OSError):
            self._sock.close()


def _next_tick(t: float, interval: float, now: float) -> float:
    """The next tick of a fixed-rate clock; after a stall (suspended, starved) it
    restarts from now instead of catching up in a burst."""
    t += interval
    return t if t > now else now + interval


_current: Session | None = None


def attach(
    job: str | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    attempt: int | None = None,
    socket_path: str | None = None,
    heartbeat_interval: float = 1.0,
    signal_after: float = 2.0,
    install_signal_handler: bool = True,
    flush_interval: float = FLUSH_INTERVAL_S,
) -> Session:
    """Attach this process to the node agent; arguments override the environment
    (TORCHELASTIC_RUN_ID/SLURM_JOB_ID, RANK, LOCAL_RANK, WORLD_SIZE,
    TORCHELASTIC_RESTART_COUNT). A missing agent is not an error."""
    global _current
    if _current is not None:
        _current.close()
    _current = Session(
        job=_NAME_BAD.sub("-", job) if job else _job_from_env(),
        rank=rank if rank is not None else _env_int("RANK", 0),
        local_rank=local_rank if local_rank is not None else _env_int("LOCAL_RANK", 0),
        world_size=world_size if world_size is not None else _env_int("WORLD_SIZE", 1),
        attempt=attempt if attempt is not None else _env_int("TORCHELASTIC_RESTART_COUNT", 0),
        socket_path=socket_path or default_socket_path(),
        heartbeat_interval=heartbeat_interval,
        signal_after=signal_after,
        install_signal_handler=install_signal_handler,
        flush_interval=flush_interval,
    )
    return _current


def current() -> Session | None:
    return _current
