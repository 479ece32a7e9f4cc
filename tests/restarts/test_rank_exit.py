"""How a rank ends, as the agent reports it (real rank processes, no torch): an exception
nothing catches is reported once, before the process dies, and its exit is never clean;
nor is a non-zero exit, even when the launcher reaps the process before the agent reads
its status."""

from __future__ import annotations

import errno
import os
from typing import Any

from tests.support import wait_for

from .conftest import HERE

RANK = str(HERE / "rank_script.py")


def _exit_of(node, pid):
    (exit_,) = wait_for(lambda: [e for e in node.kinds("rank_exit") if e.data["pid"] == pid], 30)
    return exit_


def test_an_exception_leaving_a_step_is_reported_once_before_the_unclean_exit(
    make_node: Any, spawn: Any
) -> None:
    node = make_node()
    p = spawn([RANK, "--raise-at", "5"], node.local.socket_path)
    exit_ = _exit_of(node, p.pid)
    assert p.wait(timeout=10) == 1
    (exc,) = node.kinds("exception")  # the step's report; the excepthook saw the same object
    assert exc.data["type"] == "RuntimeError" and exc.data["step"] == 4
    assert "injected failure at step 5" in exc.message
    assert node.events.index(exc) < node.events.index(exit_)
    assert exit_.data["exit_code"] == 1 and exit_.data["clean"] is False
    assert exit_.data["uncaught"] == "RuntimeError"
    assert not node.local.ranks[p.pid].clean_exit


def test_an_exception_outside_any_step_is_reported_by_the_excepthook(
    make_node: Any, spawn: Any
) -> None:
    node = make_node()
    p = spawn([RANK, "--steps", "5", "--then-raise"], node.local.socket_path)
    exit_ = _exit_of(node, p.pid)
    (exc,) = node.kinds("exception")
    assert exc.data["type"] == "ValueError" and exc.data["uncaught"] is True
    assert "failure after the last step" in exc.message and "Traceback" in exc.message
    assert exit_.data["clean"] is False and exit_.data["exit_code"] == 1
    assert p.wait(timeout=10) == 1


def test_an_exception_that_kills_a_thread_is_reported_and_the_exit_is_not_clean(
    make_node: Any, spawn: Any
) -> None:
    node = make_node()
    p = spawn([RANK, "--steps", "5", "--thread-raise"], node.local.socket_path)
    exit_ = _exit_of(node, p.pid)
    (exc,) = node.kinds("exception")
    assert exc.data["type"] == "OSError" and exc.data["thread"] == "loader"
    assert exc.data["uncaught"] is True
    # the process itself ends with 0; an uncaught exception still makes it unclean
    assert exit_.data["exit_code"] == 0 and exit_.data["clean"] is False
    assert p.wait(timeout=10) == 0


def test_a_non_zero_exit_is_not_clean(make_node: Any, spawn: Any) -> None:
    node = make_node()
    p = spawn([RANK, "--steps", "5", "--then-exit", "3"], node.local.socket_path)
    exit_ = _exit_of(node, p.pid)
    assert exit_.data["exit_code"] == 3 and exit_.data["clean"] is False
    assert not node.kinds("exception")  # an exit is no exception
    assert p.wait(timeout=10) == 3


def test_reaped_before_the_agent_looks_the_exit_is_as_the_rank_said(
    make_node: Any, spawn: Any, monkeypatch: Any
) -> None:
    # Without pidfds the agent polls /proc every check_interval; the test reaps each rank
    # at once, as a fast launcher would, so /proc has no exit status left to read.
    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "pidfd_open not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    node = make_node(check_interval=1.0)
    failed = spawn([RANK, "--steps", "5", "--then-exit", "3"], node.local.socket_path, RANK="0")
    crashed = spawn([RANK, "--steps", "5", "--then-raise"], node.local.socket_path, RANK="1")
    done = spawn([RANK, "--steps", "5"], node.local.socket_path, RANK="2")
    codes = [p.wait(timeout=30) for p in (failed, crashed, done)]
    assert codes == [3, 1, 0]
    by_rank = {
        e.rank: e
        for e in wait_for(lambda: len(node.kinds("rank_exit")) == 3 and node.kinds("rank_exit"), 30)
    }
    assert by_rank[0].data["exit_code"] == 3 and by_rank[0].data["clean"] is False
    assert by_rank[1].data["clean"] is False and by_rank[1].data["uncaught"] == "ValueError"
    assert by_rank[2].data["clean"] is True  # its bye said so and nothing contradicts it
