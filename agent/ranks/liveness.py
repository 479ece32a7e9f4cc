"""Watching the ranks of the rank table: exits, hangs and lost heartbeats.

- a rank's process is gone (or a zombie waiting to be reaped): an urgent `rank_exit` event
  at once, with the exit code or signal when /proc still shows it;
- heartbeats continue but no step completes for longer than
  max(hang_min_s, hang_factor x the rank's recent step interval): an urgent `hang` event;
- the pid is alive but heartbeats stopped: an urgent `heartbeat_lost` event.

An exit is seen at once through a pidfd per rank (`os.pidfd_open`, readable once the
process has exited), registered in the server's selector; where pidfds are unavailable
(pre-5.3 kernels, seccomp), ranks are polled in /proc every `check_interval`. The clock
checks say when they next need to run, so the server sleeps until then.

A rank's exit is clean only with exit code 0 (read from the zombie, else as the rank
said) and no uncaught exception reported.

A rank ended by a stop signal (SIGTERM, SIGINT, or their shell exit codes 143 and 130)
that the agent did not send is how a job ends when its user stops it: a signal to its
launcher (`kill`, Ctrl-C, `scancel`, a deleted pod), which passes it to its workers and
exits. Under torchrun or ft_launcher its `rank_exit` is held until the launcher (the
rank's parent) exits too, or starts the job's workers again, or for `stop_grace_s`, and
then says which: `launcher_exited` true (the job was stopped from outside) or false (the
launcher lives on and restarts its workers). Without such a launcher nothing restarts the
rank: `launcher_exited` is true at once. An exit the agent caused itself carries
`signalled_by`.

An exit whose status the agent could not read (`reaped`: the launcher reaped the zombie
before the agent's /proc read, and the rank said nothing of its end) is held the same
way under a respawning launcher: a launcher reaps at once only the workers it ends itself,
which it does when it is stopped (the launcher then exits) or restarts them (it lives on).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import selectors
import signal
import statistics
from dataclasses import dataclass
from typing import Any

from trainguard.agent.ranks.table import RankRecord, RankTable

log = logging.getLogger(__name__)

_SLACK_S = 0.01  # wake this long after a deadline, so the check finds it passed
# The agent itself did not run for this long past a planned check (SIGSTOP, a VM pause,
# swapping): what its ranks sent meanwhile was dropped or is still queued, so their
# heartbeats and steps look old. Nothing is judged by the clock for STALL_GRACE_S after.
STALL_S = 2.0
STALL_GRACE_S = 3.0


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


# What a stop request ends a process with: its signal, or the shell's exit code for it.
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
STOP_EXIT_CODES = {128 + sig: sig for sig in STOP_SIGNALS}


def stop_signal(rec: RankRecord) -> int | None:
    """The stop signal (SIGINT, SIGTERM) the rank's exit shows, if it shows one: killed by
    it, its shell-style exit code, or an uncaught KeyboardInterrupt (Ctrl-C)."""
    if rec.exit_signal in STOP_SIGNALS:
        return rec.exit_signal
    if rec.exit_code is not None and rec.exit_code in STOP_EXIT_CODES:
        return int(STOP_EXIT_CODES[rec.exit_code])
    if rec.uncaught == "KeyboardInterrupt":
        return int(signal.SIGINT)
    return None


# Launchers that respawn their workers (the SDK's `launcher`); under any other (none, a
# plain `python train.py`, srun) nothing restarts a rank that exits.
RESPAWNING = frozenset({"torchrun", "ft_launcher"})


def launcher_pid(rec: RankRecord) -> int | None:
    """The rank's respawning launcher (its parent as the SDK reports it: the shim's for
    a warm worker), unless that is init or this agent."""
    ok = rec.launcher in RESPAWNING and rec.ppid > 1 and rec.ppid != os.getpid()
    return rec.ppid if ok else None


def running(pid: int, start_ticks: int = 0) -> bool:
    """Whether `pid` is a live process (not a zombie), and the one that started at
    `start_ticks` when that is given (not another on a reused pid)."""
    info = proc_info(pid)
    if info is None or info.state in ("Z", "X"):
        return False
    return not start_ticks or info.start_ticks == start_ticks


def pid_reused(rec: RankRecord, info: ProcInfo) -> bool:
    """`info` is about another process than the rank's, on its reused pid."""
    return bool(rec.start_ticks) and info.start_ticks != rec.start_ticks


def own_zombie(rec: RankRecord, info: ProcInfo | None) -> ProcInfo | None:
    """`info` when it shows the rank's own process as a zombie (its exit status is there
    until the parent reaps it), else None."""
    if info is None or info.state != "Z" or pid_reused(rec, info):
        return None
    return info


class Liveness:
    """The exit watch and the clock checks of a RankTable (call under the server's lock,
    from its loop thread)."""

    def __init__(
        self,
        table: RankTable,
        check_interval: float = 0.1,
        hang_factor: float = 10.0,
        hang_min_s: float = 2.0,
        hang_first_step_s: float = 120.0,
        heartbeat_timeout_s: float = 10.0,
        keep_exited_s: float = 60.0,
        stop_grace_s: float = 5.0,
    ) -> None:
        self.table = table
        self.check_interval = check_interval
        self.hang_factor = hang_factor
        self.hang_min_s = hang_min_s
        self.hang_first_step_s = hang_first_step_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.keep_exited_s = keep_exited_s
        self.stop_grace_s = stop_grace_s
        self.selector: selectors.BaseSelector | None = None  # the server's, while it runs
        self._due = math.inf  # when check() asked to run next (monotonic)
        self._quiet_until = 0.0  # no clock judgment before then: the agent had stalled
        self.stalls = 0

    # --- exit watch ---------------------------------------------------------------------

    def watch(self, rec: RankRecord) -> None:
        """Open a pidfd for the rank (in the loop thread): its exit then wakes the loop.
        Without one (no pidfd_open here, or the process is already gone) the rank is
        polled in /proc every check_interval."""
        if self.selector is None or rec.pidfd is not None:
            return
        try:
            fd = os.pidfd_open(rec.pid)
        except ProcessLookupError:
            return  # gone already: the next /proc check reports it
        except (AttributeError, OSError) as exc:
            log.debug("no pidfd for pid %d (%s): polling /proc", rec.pid, exc)
            return
        rec.pidfd = fd
        self.selector.register(fd, selectors.EVENT_READ, rec)

    def unwatch(self, rec: RankRecord) -> None:
        if rec.pidfd is None:
            return
        if self.selector is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.selector.unregister(rec.pidfd)
        os.close(rec.pidfd)
        rec.pidfd = None

    def unwatch_all(self) -> None:
        for rec in self.table.ranks.values():
            self.unwatch(rec)

    def pidfd_exited(self, rec: RankRecord, now: float) -> None:
        """The rank's pidfd became readable: the process has exited. The exit status is
        read from /proc while the process is a zombie its parent has not reaped."""
        self.unwatch(rec)
        if not rec.alive:
            return
        self.exited(rec, own_zombie(rec, proc_info(rec.pid)), now)

    def exited(self, rec: RankRecord, zombie: ProcInfo | None, now: float) -> None:
        """The rank's process is gone (`zombie`: what /proc showed of it, if anything)."""
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
        # Reaped before the agent read /proc, and nothing said: a launcher reaps at once
        # only the workers it ends itself (its close on a stop signal or a restart).
        reaped = zombie is None and rec.exit_code is None and not rec.said_bye
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
            else "exit status unread: its parent reaped it first"
        )
        if rec.uncaught is not None:
            how += f", uncaught {rec.uncaught}"
        sig = stop_signal(rec)
        fields: dict[str, Any] = {
            "message": f"rank {rec.rank} pid {rec.pid} exited ({how})",
            "pid": rec.pid,
            "exit_code": rec.exit_code,
            "signal": rec.exit_signal,
            "clean": rec.clean_exit,
            "uncaught": rec.uncaught,
            "last_step": rec.last_step,
            "stop_signal": sig,
            "signalled_by": rec.signalled_by,
            "reaped": reaped or None,
        }
        if rec.signalled_by is None:
            if launcher_pid(rec) is not None and (
                sig is not None or (reaped and rec.uncaught is None)
            ):
                rec.held_exit = (now + self.stop_grace_s, fields)  # check_rank reports it
                return
            if sig is not None:
                fields["launcher_exited"] = True  # no launcher: nothing restarts it
        self.table.event("rank_exit", rec, urgent=True, ts=now, **fields)

    def held(self, rec: RankRecord, mono: float, now: float) -> float:
        """A held exit (see the module docstring): reported once the rank's launcher is
        gone or the grace is over; returns when to look again."""
        assert rec.held_exit is not None
        until, fields = rec.held_exit
        launcher = launcher_pid(rec)
        gone = launcher is None or not running(launcher)
        if not gone and now < until and not self.respawned(rec, launcher):
            return mono + self.check_interval
        rec.held_exit = None
        if gone:
            fields["message"] += f"; its launcher (pid {launcher}) exited too"
        self.table.event(
            "rank_exit", rec, urgent=True, ts=rec.exited_at, launcher_exited=gone, **fields
        )
        return mono + max(0.0, (rec.exited_at or now) + self.keep_exited_s - now) + _SLACK_S

    def respawned(self, rec: RankRecord, launcher: int | None) -> bool:
        """The rank's launcher has started its job's workers again since the rank exited:
        it lives on, so the held exit need not wait out the grace."""
        since = rec.exited_at or 0.0
        return any(
            r.alive and r.job == rec.job and r.ppid == launcher and r.registered_at > since
            for r in self.table.ranks.values()
        )

    # --- clock checks -------------------------------------------------------------------

    def hang_threshold(self, rec: RankRecord) -> float:
        """A rank needs a few steps in an iteration before its pace is known; until then
        the (long) first-step allowance applies, covering process group setup and loads."""
        if len(rec.intervals) < 2:
            return max(self.hang_min_s, self.hang_first_step_s)
        return max(self.hang_min_s, self.hang_factor * statistics.median(rec.intervals))

    def check(self, mono: float, now: float) -> float:
        """The clock checks of every rank; returns the monotonic time of the next one
        (inf: nothing to check until a message or an exit comes)."""
        late = mono - self._due
        if late > STALL_S:
            self.stalls += 1
            self._quiet_until = mono + STALL_GRACE_S
            log.warning(
                "the agent did not run for %.1f s past a planned check (stopped, paused?): "
                "no heartbeat or hang judgment for %.0f s while its ranks' news comes in",
                late,
                STALL_GRACE_S,
            )
        next_t = math.inf
        for rec in list(self.table.ranks.values()):
            next_t = min(next_t, self.check_rank(rec, mono, now))
        self._due = next_t
        return next_t

    def check_rank(self, rec: RankRecord, mono: float, now: float) -> float:
        """One rank's checks (a /proc poll too when it has no pidfd); returns when it
        next needs checking, assuming nothing happens meanwhile. Steps, heartbeats and
        the end of a checkpoint only move that time later; a message that can bring it
        closer is about this rank, and the loop calls this for it."""
        pid = rec.pid
        if not rec.alive:
            if rec.held_exit is not None:
                return self.held(rec, mono, now)
            if rec.exited_at is None:
                return math.inf
            if now - rec.exited_at > self.keep_exited_s:
                self.table.forget(rec)
                return math.inf
            return mono + (rec.exited_at + self.keep_exited_s - now) + _SLACK_S
        next_t = math.inf
        if rec.pidfd is None:
            info = proc_info(pid)
            if info is None or info.state in ("Z", "X") or pid_reused(rec, info):
                self.exited(rec, own_zombie(rec, info), now)
                return self.check_rank(rec, mono, now)
            next_t = mono + self.check_interval
        if mono < self._quiet_until:
            return min(next_t, self._quiet_until + _SLACK_S)
        hb_age = now - rec.last_heartbeat if rec.last_heartbeat else 0.0
        if hb_age > self.heartbeat_timeout_s:
            if not rec.heartbeat_lost_reported:
                rec.heartbeat_lost_reported = True
                self.table.event(
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
            self.table.event(
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
