"""The agent's table of this node's training ranks and what their messages make of it.

A rank is known by its pid, from the first identity message it sends (hello, heartbeat,
iteration, bye; trainguard.protocol.messages): a rank that attached before the agent
started registers at its next heartbeat. Its other messages are matched to it by the
socket address it sends from. `RankTable.apply` turns each typed message into the
rank's state and the wire records (`Event`s, `StepReport`s) in the agent's outbox.

What a rank declares (launcher, in_process, display name, its launcher's restart budget)
goes on every RankStatus; a value the HTTP wire would refuse is dropped here, so one odd
rank cannot get its node's batches refused.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec import UNSET

from trainguard.protocol.messages import (
    LAUNCHERS,
    Bye,
    Checkpoint,
    ExceptionReport,
    Finished,
    Identity,
    Interrupted,
    Iteration,
    Log,
    Message,
    RestartRaised,
    RestartReceived,
    Steps,
    StepTiming,
)
from trainguard.protocol.wire import (
    Event,
    Name,
    RankStatus,
    Seconds,
    Short,
    StepReport,
    Timeouts,
    wire_name,
)


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
    # when the rank last said which iteration it enters (NVRx's Wrapper entering the
    # training function, also iteration 0 of a new process): its set-up is done
    entered_at: float | None = None
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
    max_restarts: int | None = None  # the launcher's restart budget (--max-restarts)
    restart_count: int | None = None  # the restarts of it used
    # wire.Timeouts' fields it declared; None: an SDK from before them, which gets no
    # timeouts on its RankStatus either (an older backend refuses the field)
    timeouts: dict[str, Any] | None = None
    hang_reported: bool = False
    in_checkpoint: bool = False
    restarting: bool = False  # an exception was reported; no hang checks until re-entry
    finished: bool = False
    heartbeat_lost_reported: bool = False
    restart_raised: dict[str, float] = field(default_factory=dict)  # request id -> ts
    # The agent's own signal to the process ("launcher restart <command>", "stop_job
    # <command>"), set before it is sent: its exit is then trainguard's doing.
    signalled_by: str | None = None
    # The rank_exit of a stop signal (SIGTERM, SIGINT) the agent did not send, held until
    # its launcher exits too or the (wall-clock) deadline passes: (deadline, event fields).
    held_exit: tuple[float, dict[str, Any]] | None = None
    pidfd: int | None = None  # readable once the process has exited; None: poll /proc


def _wire_name(value: str | None) -> str | None:
    """`value` when the HTTP wire accepts it as a Name, else None."""
    try:
        return msgspec.convert(value, Name)
    except msgspec.ValidationError:
        return None


_TIMEOUT_FIELDS = {
    name: (Short if name == "collective_backend" else Seconds)
    for name in Timeouts.__struct_fields__
}


def _timeouts(value: Any) -> dict[str, Any]:
    """The rank's declared timeouts that the HTTP wire accepts, each on its own: one odd
    value is dropped, not the others."""
    if not isinstance(value, dict):
        return {}
    out = {}
    for name, v in value.items():
        tp = _TIMEOUT_FIELDS.get(name)
        if tp is None or v is None or isinstance(v, bool):
            continue
        try:
            out[name] = msgspec.convert(v, tp)
        except msgspec.ValidationError:
            continue
    return out


def _count(value: Any) -> int | None:
    """`value` when the HTTP wire accepts it as a restart count, else None."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**31 - 1
    return value if ok else None


class RankTable:
    """The ranks by pid (`ranks`) and by the address they send from; call under the
    server's lock."""

    def __init__(self, outbox: Any) -> None:
        self.outbox = outbox
        self.ranks: dict[int, RankRecord] = {}
        self._by_addr: dict[Any, int] = {}
        self._attempts: dict[str, int] = {}  # the highest launcher attempt seen per job

    # --- who sent it --------------------------------------------------------------------

    def sender(self, addr: Any) -> RankRecord | None:
        """The rank that sends from `addr` (None: no identity message came from there)."""
        pid = self._by_addr.get(addr)
        return self.ranks.get(pid) if pid is not None else None

    def register(self, msg: Identity, start_ticks: int, now: float) -> RankRecord:
        """A new rank, from its first identity message: `rank_start`, and `restart` when
        its attempt is a launcher restart of its job."""
        rec = RankRecord(
            pid=msg.pid,
            job=wire_name(msg.job),  # an old SDK let "/" through
            rank=msg.rank,
            local_rank=msg.local_rank,
            world_size=msg.world_size,
            attempt=msg.attempt,
            iteration=msg.iteration,
            start_ticks=start_ticks,
            registered_at=now,
            iteration_started_at=msg.ts or now,
            progress_mono=time.monotonic(),
        )
        self.ranks[rec.pid] = rec
        self._declared(rec, msg)
        self.event(
            "rank_start",
            rec,
            message=f"rank {rec.rank} pid {rec.pid} registered",
            pid=rec.pid,
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
            self.event(
                "restart",
                rec,
                message=f"launcher restart: attempt {rec.attempt}",
                level="launcher",
                attempt=rec.attempt,
            )
        if known is None or rec.attempt > known:
            self._attempts[rec.job] = rec.attempt
        return rec

    def forget(self, rec: RankRecord) -> None:
        """Drop an exited rank from the table."""
        if self.ranks.get(rec.pid) is rec:
            del self.ranks[rec.pid]
            self._by_addr.pop(rec.addr, None)

    # --- what it said -------------------------------------------------------------------

    def identity(self, rec: RankRecord, msg: Identity, addr: Any, now: float) -> None:
        """An identity message of a known rank: where it sends from, its iteration (an
        in-process restart when it grew), heartbeat, declarations and goodbye."""
        if isinstance(msg, Iteration):
            rec.entered_at = msg.ts or now
        if addr is not None:
            if rec.addr is not None and rec.addr != addr:
                self._by_addr.pop(rec.addr, None)
            rec.addr = addr
            self._by_addr[addr] = rec.pid
        # Within one process the Wrapper's iteration only grows: a lower one is a message
        # sent before the restart that arrives after it (a heartbeat racing the
        # iteration message), not a restart.
        if msg.iteration > rec.iteration:
            self.event(
                "restart",
                rec,
                message=f"in-process restart: iteration {msg.iteration}",
                level="in_process",
                iteration=msg.iteration,
                previous=rec.iteration,
            )
            rec.iteration = msg.iteration
            rec.steps_this_iteration = 0
            rec.first_step_end_this_iteration = None
            rec.iteration_started_at = msg.ts or now  # the rank's clock
            rec.progress_mono = time.monotonic()
            rec.intervals.clear()
            rec.last_step_end = None
            rec.hang_reported = False
            rec.restarting = False
        rec.rank = msg.rank
        rec.world_size = msg.world_size
        rec.ppid = msg.ppid or rec.ppid
        rec.last_heartbeat = msg.ts or now
        rec.heartbeat_lost_reported = False
        self._declared(rec, msg)
        if isinstance(msg, Bye):
            rec.said_bye = True
            if msg.uncaught:
                rec.uncaught = msg.uncaught[:256]
            if msg.exit_code is not None:
                rec.said_exit_code = msg.exit_code
            # an SDK before capabilities sends no "clean": its bye meant a clean exit
            rec.clean_exit = msg.clean is not False and rec.uncaught is None

    @staticmethod
    def _declared(rec: RankRecord, msg: Identity) -> None:
        """What the rank declared (UNSET, from an older SDK: as it was)."""
        if msg.launcher is not UNSET:
            rec.launcher = msg.launcher if msg.launcher in LAUNCHERS else None
        if msg.in_process is not UNSET:
            rec.in_process = msg.in_process if isinstance(msg.in_process, bool) else None
        if msg.display_name is not UNSET:
            rec.display_name = _wire_name(msg.display_name)
        if msg.max_restarts is not UNSET:
            rec.max_restarts = _count(msg.max_restarts)
        if msg.restart_count is not UNSET:
            rec.restart_count = _count(msg.restart_count)
        if msg.timeouts is not UNSET:
            rec.timeouts = _timeouts(msg.timeouts)

    def apply(self, rec: RankRecord, msg: Message) -> None:
        """A message about what the rank does, by its type."""
        match msg:
            case Steps():
                for timing in msg.steps:
                    self._step(rec, timing)
            case Interrupted():
                rec.restarting = True
            case ExceptionReport():
                self._exception(rec, msg)
            case Checkpoint():
                rec.in_checkpoint = msg.phase.endswith("_start")
                if not rec.in_checkpoint:
                    rec.progress_mono = time.monotonic()
                self.event(
                    "checkpoint",
                    rec,
                    ts=msg.ts,
                    message=f"checkpoint {msg.phase} step {msg.step}",
                    phase=msg.phase[:64],
                    step=msg.step,
                    blocking_s=msg.blocking_s,
                    ok=msg.ok,
                )
            case RestartRaised():
                rec.restart_raised[msg.request_id] = msg.ts or time.time()
                self.event(
                    "restart",
                    rec,
                    ts=msg.ts,
                    message="restart raised in rank",
                    phase="raised",
                    request=msg.request_id[:64],
                )
            case RestartReceived():
                pass  # the raise that follows is what counts
            case Finished():
                rec.finished = True
            case Log():
                scalars: dict[str, Any] = {
                    k[:256]: v
                    for k, v in list(msg.data.items())[:32]
                    if isinstance(v, str | int | float | bool)
                    and k not in ("ts", "message", "urgent")
                }
                self.event("log", rec, ts=msg.ts, message=msg.message, **scalars)

    def _step(self, rec: RankRecord, timing: StepTiming) -> None:
        n, end, compute = timing.step, timing.end, timing.compute
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
            self.event("log", rec, message=f"rank {rec.rank} progresses again at step {n}")
        self.outbox.put_step(
            StepReport(
                job=rec.job,
                rank=rec.rank,
                step=n,
                start=timing.start,
                end=end,
                attempt=rec.attempt,
                iteration=rec.iteration,
                compute=compute if compute is not None and compute >= 0 else None,
            )
        )

    def _exception(self, rec: RankRecord, msg: ExceptionReport) -> None:
        for other in self.job_ranks(rec.job):
            other.restarting = True
        if msg.uncaught:
            rec.uncaught = msg.exc_type[:256]
        self.event(
            "exception",
            rec,
            urgent=True,
            ts=msg.ts,
            message=f"{msg.exc_type}: {msg.message}\n{msg.traceback}",
            type=msg.exc_type[:256],
            step=msg.step,
            pid=rec.pid,
            uncaught=msg.uncaught or None,
            thread=msg.thread[:256] if msg.thread else None,
        )

    # --- what the agent says ------------------------------------------------------------

    def event(
        self,
        kind: str,
        rec: RankRecord | None,
        /,
        urgent: bool = False,
        message: str = "",
        ts: float | None = None,
        **data: Any,
    ) -> None:
        """Put an event about `rec` (None: about no rank) in the outbox."""
        self.outbox.put_event(
            Event(
                kind=kind,  # type: ignore[arg-type]  # callers pass an EventKind name
                ts=ts if ts is not None else time.time(),
                job=rec.job if rec else None,
                rank=rec.rank if rec else None,
                message=message[:4096],
                data={k: v for k, v in data.items() if v is not None},
            ),
            urgent=urgent,
        )

    def job_ranks(self, job: str, alive_only: bool = True) -> list[RankRecord]:
        return [r for r in self.ranks.values() if r.job == job and (r.alive or not alive_only)]

    def statuses(
        self, thresholds: Callable[[RankRecord], dict[str, float]] | None = None
    ) -> list[RankStatus]:
        """The table for the wire; an exited process is listed only while no live process
        holds its (job, rank), so a restarted rank is not reported dead next to its
        successor. `thresholds`: trainguard's own timeouts for a rank (the liveness
        watch's), added to what the rank declared."""
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
                launcher=r.launcher,  # type: ignore[arg-type]  # _declared keeps only LAUNCHERS
                display_name=r.display_name,
                max_restarts=r.max_restarts,
                restart_count=r.restart_count,
                timeouts=_rank_timeouts(r, thresholds),
            )
            for r in recs
        ][:1024]


def _rank_timeouts(
    rec: RankRecord, thresholds: Callable[[RankRecord], dict[str, float]] | None
) -> Timeouts | None:
    if rec.timeouts is None:
        return None
    values = {**rec.timeouts, **(thresholds(rec) if thresholds and rec.alive else {})}
    return Timeouts(**values)
