"""One training process attached to its node's agent: the step hook, the reports, and the
thread that sends them (trainguard.protocol.messages, over trainguard.sdk.transport)."""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from types import FrameType
from typing import Any

from trainguard.protocol.discovery import listening_candidate
from trainguard.protocol.messages import (
    LAUNCHERS,
    STEPS_PER_DATAGRAM,
    Bye,
    Checkpoint,
    ExceptionReport,
    Finished,
    Heartbeat,
    Hello,
    Identity,
    InjectXid,
    Interrupted,
    Iteration,
    Log,
    StepTiming,
)
from trainguard.sdk import hooks
from trainguard.sdk.identity import WRAP_MODULE, in_process_blocker, parent_pid, running_wrapper
from trainguard.sdk.restart import RestartRequested, Restarts
from trainguard.sdk.timeouts import RankTimeouts, wrapper_timeouts
from trainguard.sdk.transport import Transport

# Queued steps are sent at most this often. A step is sent at once when nothing was
# sent for this long (slow steps arrive as they end, so the agent's hang check sees
# them) and when it is the first of a generation (after attach, a new iteration or a
# raised restart: the agent's `resumed` waits for it).
FLUSH_INTERVAL_S = 1.0


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

    __slots__ = ("_n", "_r", "_s", "_t0")

    def __init__(self, session: Session) -> None:
        self._s = session
        self._r = session._restarts
        self._n = 0
        self._t0 = 0.0

    def __call__(self, n: int) -> _Step:
        self._n = n
        return self

    def __enter__(self) -> _Step:
        r = self._r
        if r.pending:
            self._s._raise_restart()
        r.in_step = True
        self._s._compute = None
        self._t0 = time.time()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        s = self._s
        self._r.in_step = False
        if exc_type is None:
            s.step_done(self._n, self._t0, time.time(), s._compute)
        elif not issubclass(exc_type, RestartRequested):
            s._step_failed(exc)


class Session:
    """One training process attached to the node agent."""

    def __init__(
        self,
        job: str,
        rank: int,
        local_rank: int,
        world_size: int,
        attempt: int,
        socket_path: str | None,
        heartbeat_interval: float = 1.0,
        signal_after: float = 2.0,
        install_signal_handler: bool = True,
        flush_interval: float = FLUSH_INTERVAL_S,
        *,
        display_name: str | None = None,
        launcher: str = "none",
        in_process: bool | None = None,
        max_restarts: int | None = None,
        restart_count: int | None = None,
        discover: bool = False,
    ) -> None:
        """`socket_path` None: no agent known yet; with `discover`, the heartbeat thread
        looks for one in the well-known places. `in_process` None: detected (see
        under_wrapper) at attach, at every heartbeat and in restart_iteration."""
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, not {launcher!r}")
        self.job = job
        self.display_name = display_name or job
        self.launcher = launcher
        # The launcher's restart budget (its --max-restarts) and the restarts it used.
        self.max_restarts = max_restarts
        self.restart_count = restart_count
        self._detect_wrapper = in_process is None
        self.timeouts = RankTimeouts(parent_pid())  # reported with the identity
        self._beats = 0
        self.local_rank = local_rank
        self.in_process = bool(in_process) or (
            in_process is None and self._wrapper_can_restart(sys._getframe())
        )
        self.exit_code: int | None = None  # as sys.exit() or a SystemExit out of a step said
        self.uncaught: str | None = None  # the type of an exception nothing caught
        self._discover = discover
        self.rank = rank
        self.world_size = world_size
        self.attempt = attempt
        self.iteration = 0
        self.pid = os.getpid()
        self.heartbeat_interval = heartbeat_interval
        self.last_step: int | None = None
        self._closed = threading.Event()
        self._transport = Transport(socket_path, f"trainguard-sdk-{self.pid}-{id(self):x}")
        self._send = self._transport.send
        self._restarts = Restarts(job, signal_after, self._send, self._closed, self._restarted)
        # Steps are queued by the hook (an append, no system call) and sent by the
        # heartbeat thread every flush_interval, or at once when the hook sets _kick:
        # for a step ending at or after _flush_due (a flush interval after the last
        # send; 0 for the first step of a generation).
        self._steps: deque[StepTiming] = deque()
        self._compute: float | None = None
        self.flush_interval = min(flush_interval, heartbeat_interval)
        self._flush_due = 0.0
        self._kick = threading.Event()
        self.max_pending_steps = 100_000
        self._flush_lock = threading.Lock()
        self._owner_ident = threading.get_ident()  # the thread that trains (attached)
        self._stepper = _Step(self)
        self._compute_cm = _Compute(self)
        if install_signal_handler:
            self._restarts.install_signal_handler()
        self._send(self._identity(Hello))
        self._listener = threading.Thread(
            target=self._restarts.listen,
            args=(self._transport.receive,),
            name="tg-sdk-listen",
            daemon=True,
        )
        self._listener.start()
        self._heart = threading.Thread(target=self._beat, name="tg-sdk-heartbeat", daemon=True)
        self._heart.start()
        atexit.register(self.close)
        # A forked child (NVRx's monitor process, data loader workers) is not this rank:
        # it must not report, and its exit must not say "bye" for the rank.
        os.register_at_fork(after_in_child=self._after_fork)

    # --- what the transport and the restart handling count ----------------------------

    @property
    def socket_path(self) -> str | None:
        """The agent's socket (None: none found yet)."""
        return self._transport.path

    @property
    def sent(self) -> int:
        """Datagrams sent to the agent."""
        return self._transport.sent

    @property
    def dropped(self) -> int:
        """Reports that could not be sent (each step of a lost datagram counts)."""
        return self._transport.dropped

    @property
    def signal_after(self) -> float:
        return self._restarts.signal_after

    @property
    def restart_requests(self) -> int:
        """Restart requests the agent sent this rank."""
        return self._restarts.requests

    def _identity(self, kind: type[Identity], **extra: Any) -> Identity:
        return kind(
            job=self.job,
            rank=self.rank,
            local_rank=self.local_rank,
            world_size=self.world_size,
            attempt=self.attempt,
            iteration=self.iteration,
            pid=self.pid,
            ppid=parent_pid(),  # the launcher, also under the warm pool
            last_step=self.last_step,
            dropped=self.dropped,
            display_name=self.display_name,
            launcher=self.launcher,
            in_process=self.in_process,
            max_restarts=self.max_restarts,
            restart_count=self.restart_count,
            timeouts=self.timeouts.current(),
            ts=time.time(),
            **extra,
        )

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
            self._transport.dropped += 1
        else:
            steps.append(StepTiming(n, start, end, compute))
        if end >= self._flush_due:
            self._flush_due = math.inf  # one kick; the send sets the next due time
            self._kick.set()
        if self._restarts.pending:
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
        if self._restarts.pending:
            self._raise_restart()

    def _raise_restart(self) -> None:
        """Raise RestartRequested (trainguard.sdk.restart)."""
        self._restarts.raise_now()

    def _restarted(self) -> None:
        """A restart is being raised: the re-entry's first step goes at once."""
        self._flush_due = 0.0

    # --- reports ----------------------------------------------------------------------

    def report_exception(
        self,
        exc: BaseException,
        max_lines: int = 12,
        *,
        uncaught: bool = False,
        thread: str | None = None,
    ) -> None:
        """Report an exception (type, message, the traceback's last lines), once per
        exception object: the step that it left, the caller's own handler and the
        uncaught-exception hooks may all see the same one."""
        if not hooks.first_report(exc):
            return
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        text = "".join(lines)
        head = "\n".join(text.splitlines()[-max_lines:])
        self._send(
            ExceptionReport(
                exc_type=type(exc).__name__,
                message=str(exc)[:1000],
                traceback=head[-3000:],
                step=self.last_step,
                uncaught=uncaught,
                thread=None if thread is None else thread[:200],
                ts=time.time(),
            )
        )

    def _step_failed(self, exc: BaseException) -> None:
        """An exception left a step (not RestartRequested): an Exception is reported at
        once, a SystemExit keeps its exit code for the goodbye. Others (KeyboardInterrupt,
        NVRx's RankShouldRestart: a peer failed) are no fault of this rank's."""
        if isinstance(exc, Exception):
            self.report_exception(exc)
        elif isinstance(exc, SystemExit):
            self.exit_code = hooks.exit_code(exc.code)

    def _uncaught(self, exc: BaseException, thread: threading.Thread | None) -> None:
        """From the exception hooks: nothing caught `exc` (in `thread`, None: the main
        thread, whose exception ends the process)."""
        self.uncaught = type(exc).__name__
        if not isinstance(exc, KeyboardInterrupt):  # an operator's Ctrl-C is no fault
            name = None if thread is None else thread.name
            self.report_exception(exc, uncaught=True, thread=name)

    def report_interrupted(self, reason: str = "") -> None:
        """The training function is being torn down for a restart it did not cause (e.g.
        NVRx's RankShouldRestart): the agent stops hang checks until the rank re-enters."""
        self._send(Interrupted(reason=reason[:500], step=self.last_step, ts=time.time()))

    @contextlib.contextmanager
    def checkpoint(self, phase: str, step: int | None = None) -> Iterator[None]:
        """`with session.checkpoint("save", step):` measures the blocking time of a
        checkpoint save (or "restore") and reports its start and end."""
        t0 = time.time()
        self._send(Checkpoint(phase=f"{phase}_start", step=step, ts=t0))
        ok = False
        try:
            yield
            ok = True
        finally:
            t1 = time.time()
            self.timeouts.saved(phase, t1 - t0)
            self._send(
                Checkpoint(
                    phase=f"{phase}_end", step=step, ts=t1, blocking_s=round(t1 - t0, 6), ok=ok
                )
            )

    def restart_iteration(
        self, iteration: int, rank: int | None = None, world_size: int | None = None
    ) -> None:
        """Report the Wrapper's restart iteration (and the rank it now has). A restart
        that happened clears a pending request: it has been served."""
        if iteration != self.iteration:
            self._restarts.pending = False
        if self._detect_wrapper and not self.in_process:
            self.in_process = self._wrapper_can_restart(sys._getframe())
        self.iteration = iteration
        if rank is not None:
            self.rank = rank
        if world_size is not None:
            self.world_size = world_size
        with self._flush_lock:  # the old iteration's queued steps go first
            self._drain_steps()
            self._send(self._identity(Iteration))
            self._flush_due = 0.0  # the new iteration's first step goes at once

    def finished(self) -> None:
        """No more steps will come (the agent stops watching this rank for hangs)."""
        self._send(Finished(step=self.last_step, ts=time.time()))

    def inject_xid(self, gpu_index: int, code: int, message: str = "") -> None:
        """Ask the agent to inject a simulated XID (fault injection on simulated GPUs)."""
        self._send(InjectXid(gpu=gpu_index, xid=code, message=message, ts=time.time()))

    def log(self, message: str, **data: Any) -> None:
        self._send(Log(message=message[:2000], data=data, ts=time.time()))

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
                self._heartbeat()
                next_beat = _next_tick(next_beat, self.heartbeat_interval, now)
        self._flush_steps()

    def _wrapper_can_restart(self, frame: FrameType) -> bool:
        """Whether NVRx's Wrapper runs the code of `frame` and can restart it in process
        here. A Wrapper that cannot (`in_process_blocker`: NVRx 0.5+'s NVML checks on a
        host without NVML) is said once on stderr (local rank 0), the rank declares
        `in_process` false, and detection stops: the engine then never picks that level."""
        wrapper = running_wrapper(frame)
        if wrapper is None:
            return False
        self.timeouts.wrapper = wrapper_timeouts(wrapper)
        blocker = in_process_blocker(wrapper)
        if blocker is None:
            return True
        self._detect_wrapper = False
        if self.local_rank == 0:
            print(
                f"trainguard: in-process restarts are off for this job: {blocker}; "
                "faults are restarted by the launcher instead",
                file=sys.stderr,
                flush=True,
            )
        return False

    def _heartbeat(self) -> None:
        self._beats += 1
        if self._beats % 10 == 1:
            self.timeouts.look_for_ft_heartbeats()
        if self._detect_wrapper and not self.in_process and WRAP_MODULE in sys.modules:
            frame = sys._current_frames().get(self._owner_ident)
            self.in_process = frame is not None and self._wrapper_can_restart(frame)
            del frame
        elif self.timeouts.wrapper is None and WRAP_MODULE in sys.modules:
            # in_process declared outright: the Wrapper's timeouts are still its own
            frame = sys._current_frames().get(self._owner_ident)
            wrapper = running_wrapper(frame) if frame is not None else None
            if wrapper is not None:
                self.timeouts.wrapper = wrapper_timeouts(wrapper)
            del frame, wrapper
        if not self._send(self._identity(Heartbeat)) and self._discover:
            # no agent yet, or it went away: an agent may listen in another well-known place
            path, _ = listening_candidate(os.environ)
            if path is not None and path != self._transport.path:
                self._transport.path = path
                self._send(self._identity(Hello))

    def flush(self) -> None:
        """Send the steps queued so far now (the heartbeat thread does it every
        flush_interval, and at once for a step that starts a generation or ends a flush
        interval after the last send; close() does it too)."""
        self._flush_steps()

    def _flush_steps(self) -> None:
        with self._flush_lock:
            self._drain_steps()

    def _drain_steps(self) -> None:
        """Send the queued steps, up to STEPS_PER_DATAGRAM per datagram (off the training
        thread). Callers hold _flush_lock, so steps and a new iteration reach the agent
        in the order they happened."""
        steps = self._steps
        if not steps:
            return
        while steps:
            chunk: list[StepTiming] = []
            while steps and len(chunk) < STEPS_PER_DATAGRAM:
                chunk.append(steps.popleft())
            if self._transport.forked:
                return
            self._transport.send_steps(chunk)
        self._flush_due = time.time() + self.flush_interval

    def _after_fork(self) -> None:
        self._transport.forked = True
        self._closed.set()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._kick.set()  # the heartbeat thread ends
        self._flush_steps()
        # Clean only as far as the SDK knows: the agent also reads the exit status
        clean = self.uncaught is None and self.exit_code in (None, 0)
        self._send(
            self._identity(Bye, clean=clean, uncaught=self.uncaught, exit_code=self.exit_code)
        )
        self._transport.close()


def _next_tick(t: float, interval: float, now: float) -> float:
    """The next tick of a fixed-rate clock; after a stall (suspended, starved) it
    restarts from now instead of catching up in a burst."""
    t += interval
    return t if t > now else now + interval
