"""The demo's (and the chaos bench's) scheduler: a node whose launcher ended while the
run goes on gets a launcher again once it is readmitted, and not while it is cordoned,
while its state is not known, or once the whole run has ended. Real processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from trainguard.backend.demowatch import relaunch_readmitted

NAMES = ["n0", "n1", "n2"]


def _proc(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def _run(started: list[subprocess.Popen], ended: set[int]) -> list[subprocess.Popen]:
    procs = [_proc(0 if i in ended else 60) for i in range(3)]
    started.extend(procs)
    for i in ended:
        procs[i].wait()
    return procs


def _start(started: list[subprocess.Popen]):
    def start(i: int) -> subprocess.Popen:
        p = _proc(60)
        started.append(p)
        return p

    return start


def test_a_readmitted_node_gets_its_launcher_back_and_a_cordoned_one_does_not(
    started: list[subprocess.Popen],
) -> None:
    procs = _run(started, ended={1, 2})
    old = list(procs)
    state = {"n1": False, "n2": True}  # n1 readmitted, n2 still cordoned
    back = relaunch_readmitted(procs, NAMES, state.get, _start(started))
    assert back == [1]
    assert procs[1] is not old[1] and procs[1].poll() is None
    assert procs[0] is old[0] and procs[2] is old[2]


def test_a_node_of_unknown_state_waits(started: list[subprocess.Popen]) -> None:
    procs = _run(started, ended={2})
    assert relaunch_readmitted(procs, NAMES, lambda name: None, _start(started)) == []
    assert procs[2].poll() is not None


def test_nothing_is_started_once_the_whole_run_ended(started: list[subprocess.Popen]) -> None:
    procs = _run(started, ended={0, 1, 2})
    asked: list[str] = []

    def cordoned(name: str) -> bool:
        asked.append(name)
        return False

    assert relaunch_readmitted(procs, NAMES, cordoned, _start(started)) == []
    assert asked == []
