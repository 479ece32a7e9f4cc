"""The agent's held exits (agent/ranks/liveness.py): an exit that may be its job's stop
waits for the rank's launcher to say what it was. Here with a real process standing in
for the launcher; tests/restarts/test_job_states.py runs the same with torchrun and
ft_launcher."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest

from tests.agent.conftest import Outbox
from trainguard.agent.ranks.liveness import Liveness
from trainguard.agent.ranks.table import RankRecord, RankTable

GONE_PID = 2**22 + 7  # above the default pid_max: no such process


@pytest.fixture
def launcher(sleeper: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    return sleeper


def rank(pid: int, launcher_pid: int, rank: int = 0, **kw: Any) -> RankRecord:
    return RankRecord(pid=pid, job="job", rank=rank, ppid=launcher_pid, launcher="torchrun", **kw)


def setup(grace: float = 30.0) -> tuple[Liveness, Outbox]:
    outbox = Outbox()
    return Liveness(RankTable(outbox), stop_grace_s=grace), outbox


def test_an_unread_exit_waits_for_its_launcher_and_says_it_exited(
    launcher: subprocess.Popen[bytes],
) -> None:
    live, outbox = setup()
    rec = rank(GONE_PID, launcher.pid)
    live.table.ranks[rec.pid] = rec
    live.exited(rec, None, time.time())  # reaped before /proc was read, nothing said
    live.check(time.monotonic(), time.time())
    assert outbox.events == []  # held while the launcher runs
    launcher.kill()
    launcher.wait()
    live.check(time.monotonic(), time.time())
    (ev,) = outbox.events
    assert ev.kind == "rank_exit"
    assert ev.data["reaped"] is True and ev.data["launcher_exited"] is True, ev.data
    assert "stop_signal" not in ev.data
    assert "exit status unread" in ev.message and "exited too" in ev.message


def test_a_held_exit_is_let_go_when_the_launcher_starts_the_workers_again(
    launcher: subprocess.Popen[bytes],
) -> None:
    live, outbox = setup(grace=600)
    now = time.time()
    old = rank(GONE_PID, launcher.pid)
    live.table.ranks[old.pid] = old
    live.exited(old, None, now)
    live.check(time.monotonic(), time.time())
    assert outbox.events == []
    new = rank(GONE_PID + 1, launcher.pid, registered_at=now + 1)  # the next generation
    live.table.ranks[new.pid] = new
    live.check_rank(old, time.monotonic(), time.time())
    (ev,) = outbox.events
    assert ev.data["launcher_exited"] is False, ev.data


def test_an_unread_exit_that_said_its_exception_is_reported_at_once(
    launcher: subprocess.Popen[bytes],
) -> None:
    live, outbox = setup()
    rec = rank(GONE_PID, launcher.pid, uncaught="RuntimeError")
    live.table.ranks[rec.pid] = rec
    live.exited(rec, None, time.time())
    (ev,) = outbox.events
    assert ev.data["uncaught"] == "RuntimeError" and "launcher_exited" not in ev.data


def test_an_unread_exit_without_a_launcher_is_no_stop() -> None:
    live, outbox = setup()
    rec = RankRecord(pid=GONE_PID, job="job", rank=0, ppid=1, launcher=None)
    live.table.ranks[rec.pid] = rec
    live.exited(rec, None, time.time())
    (ev,) = outbox.events
    assert ev.data["reaped"] is True and "launcher_exited" not in ev.data
