"""The agent judges its ranks by the clock (agent/ranks/liveness.py): a rank that stops
heartbeating is `heartbeat_lost`. When the agent itself did not run for a while (SIGSTOP,
a VM pause, swapping), its ranks' heartbeats of that time were dropped or still wait in
the socket, so every rank looks silent: seen in the demo, an agent stopped for 70 s
reported heartbeat_lost for its healthy ranks on resuming, and the engine restarted the
job. After a stall nothing is judged by the clock for a grace time; a rank that really
stopped heartbeating is still reported after it. A real process stands in for the rank."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.agent.conftest import Outbox
from trainguard.agent.ranks.liveness import STALL_GRACE_S, Liveness
from trainguard.agent.ranks.table import RankRecord, RankTable
from trainguard.protocol.wire import Event


class Clock:
    """The server loop's calls of `check`, each when the last one asked (a rank without
    a pidfd is polled every 0.1 s), on a clock the test moves."""

    def __init__(self, live: Liveness) -> None:
        self.live, self.mono, self.now = live, time.monotonic(), time.time()
        self.due = live.check(self.mono, self.now)

    def run(self, seconds: float) -> None:
        end = self.mono + seconds
        while self.due <= end:
            self.now += self.due - self.mono
            self.mono = self.due
            self.due = self.live.check(self.mono, self.now)
        self.now += end - self.mono
        self.mono = end

    def stall(self, seconds: float) -> None:
        """The agent does not run: the next check comes `seconds` late."""
        self.now += seconds + (self.due - self.mono)
        self.mono = self.due + seconds
        self.due = self.live.check(self.mono, self.now)


def _setup(pid: int) -> tuple[Liveness, RankRecord, Outbox, Clock]:
    outbox = Outbox()
    live = Liveness(RankTable(outbox), heartbeat_timeout_s=10.0)
    rec = RankRecord(pid=pid, job="job", rank=0, last_heartbeat=time.time())
    rec.progress_mono = time.monotonic()
    live.table.ranks[pid] = rec
    return live, rec, outbox, Clock(live)


def _lost(outbox: Outbox) -> list[Event]:
    return [e for e in outbox.events if e.kind == "heartbeat_lost"]


def test_after_its_own_stall_the_agent_waits_for_its_ranks_news(
    sleeper: subprocess.Popen[bytes],
) -> None:
    live, rec, outbox, clock = _setup(sleeper.pid)
    rec.last_heartbeat = clock.now
    clock.stall(70)  # resumed after 70 s: its rank's heartbeat looks 70 s old
    assert _lost(outbox) == [] and live.stalls == 1
    clock.run(0.5)
    rec.last_heartbeat = clock.now  # the rank's next heartbeat comes in
    clock.run(STALL_GRACE_S + 1)
    assert _lost(outbox) == []


def test_a_rank_that_stopped_heartbeating_is_still_reported_after_the_grace(
    sleeper: subprocess.Popen[bytes],
) -> None:
    live, rec, outbox, clock = _setup(sleeper.pid)
    rec.last_heartbeat = clock.now
    clock.stall(70)
    assert _lost(outbox) == []
    clock.run(STALL_GRACE_S + 0.5)
    (ev,) = _lost(outbox)
    assert ev.data["age_s"] == pytest.approx(70 + STALL_GRACE_S, abs=0.2)
    assert live.stalls == 1


def test_checks_on_time_judge_at_once(sleeper: subprocess.Popen[bytes]) -> None:
    live, rec, outbox, clock = _setup(sleeper.pid)
    rec.last_heartbeat = clock.now
    clock.run(10.5)  # no heartbeat for 10 s, every check on time
    assert live.stalls == 0
    (ev,) = _lost(outbox)
    assert 10 < ev.data["age_s"] < 10.2
