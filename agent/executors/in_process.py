"""The in-process restart of the command executor (CommandLoop, agent/executors/loop.py): the
restart request goes to the job's ranks through the SDK channel; torn_down = a rank raised
RestartRequested, restarted = every local rank reported a new Wrapper iteration, resumed =
every local rank completed a step in that iteration. Ranks that die on the way hand the
command over to their launcher's restart (agent/executors/launcher.py).
"""

from __future__ import annotations

import time

from trainguard.agent.executors.launcher import LauncherRestart
from trainguard.protocol.wire import Command


class InProcessRestart(LauncherRestart):
    """CommandLoop's in_process level, on top of the launcher level it falls back to."""

    def _in_process(self, cmd: Command) -> None:
        local, job = self.local, cmd.job
        with local.cond:
            before = {r.pid: r.iteration for r in local.job_ranks(job)}
            known = list(local.job_ranks(job, alive_only=False))
            served = self._already_restarted(cmd, "in_process")
        if not before:
            # Nothing to restart in process: the launcher may be restarting the workers.
            self._follow_launcher(cmd, known)
            return
        if served is not None:
            # NVRx's Wrapper restarts on an exception by itself: when every rank is already
            # past the fault's generation, a second restart would only cost time.
            self._report_served(cmd, served)
            return
        local.request_restart(job, cmd.id, cmd.reason or "in_process restart requested")

        def torn_down() -> float | None:
            stamps = [
                r.restart_raised[cmd.id]
                for r in local.job_ranks(job, alive_only=False)
                if cmd.id in r.restart_raised
            ]
            moved = [
                r
                for r in local.job_ranks(job, alive_only=False)
                if r.pid in before and r.iteration != before[r.pid]
            ]
            if stamps:
                return min(stamps)
            if moved:
                return time.time()
            dead = [r for r in local.job_ranks(job, alive_only=False) if r.pid in before]
            return -1.0 if all(not r.alive for r in dead) else None

        ts = local.wait_until(torn_down, self.torn_down_timeout_s)
        if ts is not None and ts < 0:
            self._follow_launcher(cmd, known)  # every rank died before it could raise
            return
        if ts is None:
            self._ack(cmd.id, "failed", time.time(), "no rank raised the restart request")
            return
        self._ack(cmd.id, "torn_down", ts)

        def restarted() -> float | None:
            recs = [r for r in local.job_ranks(job, alive_only=False) if r.pid in before]
            if any(not r.alive for r in recs):
                return -1.0  # a rank died: the launcher takes over
            if all(r.iteration != before[r.pid] for r in recs):
                return max(r.iteration_started_at for r in recs)
            return None

        ts = local.wait_until(restarted, self.restarted_timeout_s)
        if ts is not None and ts < 0:
            self._follow_launcher(cmd, known, acked={"torn_down"})
            return
        if ts is None:
            self._ack(cmd.id, "failed", time.time(), "ranks did not re-enter")
            return
        self._ack(cmd.id, "restarted", ts)

        self._ack_resumed(cmd, set(before))
