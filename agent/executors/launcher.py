"""The launcher restart of the command executor (CommandLoop, agent/executors/loop.py): SIGTERM
to the job's worker processes on this node (never their launcher), SIGKILL after
`grace_s`, then the launcher's new workers; and following a restart the launcher does by
itself (ft_launcher restarting its worker group after a rank death), which both restart
levels fall back to when the job's workers here are gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from trainguard.agent.ranks.liveness import launcher_pid, proc_info, running
from trainguard.agent.ranks.server import LocalServer
from trainguard.protocol.payloads import ExcludeNodeParams, LauncherParams, StopJobParams
from trainguard.protocol.wire import Command, Phase

log = logging.getLogger(__name__)


class LauncherRestart:
    """CommandLoop's launcher level; the loop holds the settings and the acks below."""

    local: LocalServer
    grace_s: float
    torn_down_timeout_s: float
    restarted_timeout_s: float
    relaunch_grace_s: float
    stop_timeout_s: float

    if TYPE_CHECKING:  # CommandLoop's (agent/executors/loop.py), shared by both levels

        def _ack(self, command_id: str, phase: Phase, ts: float, detail: str = "") -> None: ...

        def _ack_resumed(self, cmd: Command, pids: set[int], detail: str = "") -> None: ...

        def _already_restarted(self, cmd: Command, level: str) -> list[Any] | None: ...

        def _report_served(self, cmd: Command, recs: list[Any]) -> None: ...

    def _follow_launcher(self, cmd: Command, known: list[Any], acked: Collection[str] = ()) -> None:
        """The job's workers here are gone (or going): the command ended them, or their
        launcher is restarting the worker group by itself (ft_launcher after a rank
        death). Wait for its new workers and ack that restart, with its own times, as
        this command's; `failed` when no launcher lives to restart them (after
        `relaunch_grace_s`: it gave up, its restart budget spent, or was ended) or no new
        workers come within `restarted_timeout_s`.

        `known`: every record of the job here (alive or exited) when the command came, or
        of the generation that died; `acked`: the phases this command acked already."""
        local, job = self.local, cmd.job
        if not known or all(r.clean_exit or r.finished for r in known):
            # Never here, or its ranks here finished their work: nothing will come back.
            self._ack(cmd.id, "failed", time.time(), f"no live rank of job {job} on this node")
            return
        old = {r.pid for r in known}
        latest = max(r.attempt for r in known)
        expected = len({r.rank for r in known if r.attempt == latest})
        parents = {r.ppid for r in known if r.ppid > 1 and r.ppid != os.getpid()}
        since = time.monotonic()

        def new_workers() -> list[Any] | None:
            fresh = [r for r in local.job_ranks(job) if r.pid not in old]
            if len(fresh) >= expected:
                return fresh
            if time.monotonic() - since > self.relaunch_grace_s and not any(
                running(p) for p in parents
            ):
                return []  # nobody left to start them
            return None

        fresh = local.wait_until(new_workers, self.restarted_timeout_s)
        if not fresh:
            why = (
                "their launcher is gone"
                if fresh is not None
                else f"the launcher started no new workers within {self.restarted_timeout_s:g} s"
            )
            self._ack(cmd.id, "failed", time.time(), f"the workers of job {job} exited and {why}")
            return
        detail = f"restarted by the job's launcher (attempt {max(r.attempt for r in fresh)})"
        if "torn_down" not in acked:
            with local.cond:
                ends = [r.exited_at for r in local.job_ranks(job, alive_only=False) if r.pid in old]
            gone = [e for e in ends if e is not None]
            self._ack(cmd.id, "torn_down", max(gone) if gone else time.time(), detail)
        if "restarted" not in acked:
            self._ack(cmd.id, "restarted", max(r.registered_at for r in fresh), detail)
        self._ack_resumed(cmd, {r.pid for r in fresh}, detail)

    def _launcher(self, cmd: Command) -> None:
        local, job = self.local, cmd.job
        params = cmd.typed_params()
        grace = params.grace_s if isinstance(params, LauncherParams) else None
        grace = self.grace_s if grace is None else grace
        with local.cond:
            recs = local.job_ranks(job)
            known = list(local.job_ranks(job, alive_only=False))
            served = self._already_restarted(cmd, "launcher")
            launchers = {r.ppid for r in recs}
            victims = {
                r.pid: r.start_ticks
                for r in recs
                if r.pid not in launchers and r.pid != os.getpid()
            }
            if served is None:
                for r in recs:
                    if r.pid in victims:
                        r.signalled_by = f"launcher restart {cmd.id}"
        if served is not None:
            # The launcher already made a new generation after the fault: ending it would
            # only restart the job a second time.
            self._report_served(cmd, served)
            return
        if not victims:
            self._follow_launcher(cmd, known)
            return
        self._signal_all(victims, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not self._all_gone(victims):
            time.sleep(0.05)
        if not self._all_gone(victims):
            self._signal_all(victims, signal.SIGKILL)
            deadline = time.monotonic() + self.torn_down_timeout_s
            while time.monotonic() < deadline and not self._all_gone(victims):
                time.sleep(0.05)
        if not self._all_gone(victims):
            self._ack(cmd.id, "failed", time.time(), "worker processes did not end")
            return
        self._ack(cmd.id, "torn_down", time.time(), f"ended {len(victims)} worker(s)")
        # Its launcher starts them again, or exits instead (its restart budget spent, or
        # ended meanwhile): that is a failure at once, not after restarted_timeout_s.
        with local.cond:
            known = [r for r in local.job_ranks(job, alive_only=False) if r.pid in victims]
        self._follow_launcher(cmd, known, acked=("torn_down",))

    def _stop_job(self, cmd: Command) -> None:
        """stop_job: end the job here as its user would, with SIGTERM to its launcher (it
        passes the signal to its workers and exits without restarting them), or to its
        ranks where no launcher respawns them. Their exits then say they were
        trainguard's doing. `torn_down` once all of those are gone; `failed` when one is
        not permitted or outlives `stop_timeout_s` (the launcher then goes on restarting
        the job), or nothing of the job runs here.

        The launcher is found from the job's ranks alive or recently exited here, so a
        launcher between two generations is found too."""
        params = cmd.typed_params()
        timeout = params.timeout_s if isinstance(params, StopJobParams) else None
        timeout = self.stop_timeout_s if timeout is None else timeout
        self._end_launchers(cmd, f"stop_job {cmd.id}", timeout, kill=False)

    def _leave(self, cmd: Command) -> None:
        """exclude_node: this node leaves the job. SIGTERM to the job's launcher here, as
        stop_job, then SIGKILL to it and its workers once `grace_s` is over (a launcher
        that ignores SIGTERM must not keep the node in the job). A launcher ended by a
        signal leaves the rendezvous open (torchrun and ft_launcher close it only when
        they end by themselves): the job's other nodes re-form without this one, on a
        spare launcher waiting beyond `--nnodes` MAX, or with fewer nodes where MIN
        allows. `torn_down` once everything of the job here is gone, saying how."""
        params = cmd.typed_params()
        grace = params.grace_s if isinstance(params, ExcludeNodeParams) else None
        grace = self.stop_timeout_s if grace is None else grace
        self._end_launchers(cmd, f"exclude_node {cmd.id}", grace, kill=True)

    def _end_launchers(self, cmd: Command, tag: str, timeout: float, *, kill: bool) -> None:
        """SIGTERM to the job's launchers here (or its ranks, where none respawns them),
        waiting `timeout` for them to end; past it SIGKILL to what is left of them and
        their workers when `kill`, else `failed`."""
        local, job = self.local, cmd.job
        with local.cond:
            recs = local.job_ranks(job, alive_only=False)
            launchers = {p for r in recs if (p := launcher_pid(r)) is not None and running(p)}
            targets = {p: info.start_ticks for p in launchers if (info := proc_info(p))}
            workers = {r.pid: r.start_ticks for r in recs if r.alive}
            targets |= {r.pid: r.start_ticks for r in recs if r.alive and launcher_pid(r) is None}
            for r in recs:
                if r.alive:
                    r.signalled_by = tag
        if not targets:
            self._ack(cmd.id, "failed", time.time(), f"no live rank of job {job} on this node")
            return
        for pid in sorted(targets):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            except PermissionError:
                self._ack(cmd.id, "failed", time.time(), f"not permitted to signal pid {pid}")
                return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._all_gone(targets):
            time.sleep(0.05)
        pids = ", ".join(map(str, sorted(targets)))
        left = sorted(p for p, st in targets.items() if running(p, st))
        if not left:
            self._ack(cmd.id, "torn_down", time.time(), f"ended pid {pids} with SIGTERM")
            return
        if not kill:
            why = f"pid {left[0]} still runs {timeout:g} s after SIGTERM"
            self._ack(cmd.id, "failed", time.time(), why)
            return
        log.warning(
            "command %s: pid %s still ran %g s after SIGTERM: SIGKILL", cmd.id, left, timeout
        )
        everything = {**targets, **workers}
        self._signal_all(everything, signal.SIGKILL)
        deadline = time.monotonic() + self.torn_down_timeout_s
        while time.monotonic() < deadline and not self._all_gone(everything):
            time.sleep(0.05)
        if not self._all_gone(everything):
            self._ack(cmd.id, "failed", time.time(), f"pid {left[0]} did not end on SIGKILL")
            return
        killed = ", ".join(map(str, left))
        self._ack(
            cmd.id,
            "torn_down",
            time.time(),
            f"ended pid {pids}: pid {killed} ignored SIGTERM for {timeout:g} s and was killed",
        )

    def _all_gone(self, victims: dict[int, int]) -> bool:
        return not any(running(pid, st) for pid, st in victims.items())

    def _signal_all(self, victims: dict[int, int], sig: int) -> None:
        for pid, st in victims.items():
            if running(pid, st):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
