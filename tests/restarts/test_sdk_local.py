"""The SDK and the agent's SDK server, with real rank processes (no torch)."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from typing import Any

from tests.support import wait_for
from trainguard import sdk

from .conftest import HERE

RANK = str(HERE / "rank_script.py")


def test_without_an_agent_the_step_hook_drops_and_counts(tmp_path) -> None:
    tg = sdk.attach(
        job="j", rank=0, socket_path=str(tmp_path / "nobody.sock"), install_signal_handler=False
    )
    try:
        for n in range(100):
            with tg.step(n):
                pass
        tg.flush()
        assert tg.dropped >= 100
        assert tg.last_step == 99
    finally:
        tg.close()


def test_steps_and_rank_status_reach_the_outbox(make_node, spawn) -> None:
    node = make_node()
    p = spawn([RANK, "--steps", "20"], node.local.socket_path, RANK="3", WORLD_SIZE="4")
    # not reaped yet: the agent reads the exit status of the zombie, as with a launcher
    exits = wait_for(lambda: node.kinds("rank_exit"), timeout=30)
    assert p.wait(timeout=5) == 0
    assert exits[0].data["exit_code"] == 0 and exits[0].data["clean"] is True
    assert sorted(s.step for s in node.steps) == list(range(20))
    assert {(s.job, s.rank) for s in node.steps} == {("job1", 3)}
    assert node.kinds("rank_start")[0].data["world_size"] == 4
    node.local.wait_settled()  # the uplink lists ranks once running ones could register
    (status,) = node.agent.outbox.ranks_provider()
    assert (status.rank, status.pid, status.last_step, status.alive) == (3, p.pid, 19, False)


def test_a_hang_is_detected_while_heartbeats_continue(make_node, spawn) -> None:
    node = make_node(hang_min_s=0.5, hang_factor=10.0)
    p = spawn([RANK, "--hang-at", "15", "--step-s", "0.02"], node.local.socket_path)
    (hang,) = wait_for(lambda: node.kinds("hang"), timeout=30)
    rec = node.local.ranks[p.pid]
    assert hang.data["last_step"] == 14 and rec.last_step == 14
    assert time.time() - (rec.last_heartbeat or 0) < 1.0  # alive and heartbeating
    assert p.poll() is None
    assert not node.kinds("heartbeat_lost") and not node.kinds("rank_exit")


def test_a_rank_exit_is_reported_with_its_code_or_signal(make_node, spawn) -> None:
    node = make_node()
    a = spawn([RANK, "--exit-at", "5", "--exit-code", "3"], node.local.socket_path, RANK="0")
    b = spawn([RANK], node.local.socket_path, RANK="1")
    wait_for(lambda: b.pid in node.local.ranks and node.local.ranks[b.pid].last_step, timeout=20)
    b.send_signal(signal.SIGKILL)
    exits = wait_for(lambda: len(node.kinds("rank_exit")) == 2 and node.kinds("rank_exit"), 20)
    by_rank = {e.rank: e for e in exits}
    assert by_rank[0].data["exit_code"] == 3
    assert by_rank[1].data["signal"] == signal.SIGKILL
    assert all(e.ts > 0 for e in exits)
    a.wait(5), b.wait(5)


def test_a_restart_request_is_raised_at_the_next_step_boundary(make_node, spawn) -> None:
    node = make_node()
    p = spawn([RANK], node.local.socket_path)
    wait_for(lambda: (node.local.ranks.get(p.pid) or None) and node.local.ranks[p.pid].last_step)
    assert node.local.request_restart("job1", "req-1", "test") == [p.pid]
    wait_for(lambda: node.local.ranks[p.pid].iteration == 1, timeout=10)
    assert "req-1" in node.local.ranks[p.pid].restart_raised
    (restart,) = [e for e in node.kinds("restart") if e.data.get("level") == "in_process"]
    assert restart.data["iteration"] == 1
    assert node.local.request_restart("other-job", "req-2") == []


def test_a_rank_stuck_in_a_long_step_is_interrupted_by_a_signal(make_node, spawn) -> None:
    node = make_node()
    p = spawn([RANK, "--long-step-at", "10", "--signal-after", "0.3"], node.local.socket_path)
    wait_for(lambda: p.pid in node.local.ranks and node.local.ranks[p.pid].last_step == 9, 20)
    t0 = time.monotonic()
    node.local.request_restart("job1", "req-long")
    wait_for(lambda: node.local.ranks[p.pid].iteration == 1, timeout=15)
    assert time.monotonic() - t0 < 15  # the step itself would have lasted 30 s
    wait_for(lambda: (node.local.ranks[p.pid].last_step or 0) >= 10, timeout=10)  # redone


def test_an_xid_posted_through_the_socket_reaches_the_simulated_gpus(make_node) -> None:
    node = make_node()
    tg = sdk.attach(job="j", socket_path=node.local.socket_path, install_signal_handler=False)
    try:
        tg.inject_xid(1, 79, "fault injection")
        (xid,) = wait_for(lambda: node.kinds("xid"), timeout=10)
        assert xid.xid == 79 and xid.gpu_uuid == node.agent.simulated.gpus[1].uuid
        assert node.agent.simulated.is_lost(1)
    finally:
        tg.close()


def test_a_forked_child_does_not_report_for_the_rank(tmp_path) -> None:
    # NVRx forks a monitor process from every rank; its exit must not say "bye" for it
    tg = sdk.attach(job="j", socket_path=str(tmp_path / "none.sock"), install_signal_handler=False)
    try:
        pid = os.fork()
        if pid == 0:
            before = tg.sent + tg.dropped
            tg.step_done(1, 1.0, 2.0)
            tg.close()
            os._exit(0 if tg.sent + tg.dropped == before else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        before = tg.dropped
        tg.step_done(2, 1.0, 2.0)
        tg.flush()
        assert tg.dropped >= before + 1
    finally:
        tg.close()


def test_an_exit_wakes_the_server_at_once_without_any_polling(make_node, spawn) -> None:
    # no clock check can fire within the test: only the rank's pidfd can report the exit
    node = make_node(check_interval=3600, heartbeat_timeout_s=3600, hang_first_step_s=3600)
    p = spawn([RANK, "--exit-at", "5", "--exit-code", "3"], node.local.socket_path)
    (exit_,) = wait_for(lambda: node.kinds("rank_exit"), timeout=20)
    assert exit_.data["exit_code"] == 3  # read from the zombie, before the test reaps it
    assert p.wait(timeout=5) == 3
    rec = node.local.ranks[p.pid]
    assert not rec.alive and rec.pidfd is None  # closed once it fired
    assert rec.last_step == 4


def test_without_pidfds_ranks_are_polled_in_proc(make_node, spawn, monkeypatch) -> None:
    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "pidfd_open not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    node = make_node(check_interval=0.05)
    a = spawn([RANK, "--exit-at", "5", "--exit-code", "3"], node.local.socket_path, RANK="0")
    b = spawn([RANK], node.local.socket_path, RANK="1")
    wait_for(lambda: b.pid in node.local.ranks and node.local.ranks[b.pid].last_step, timeout=20)
    assert node.local.ranks[b.pid].pidfd is None
    b.send_signal(signal.SIGKILL)
    exits = wait_for(lambda: len(node.kinds("rank_exit")) == 2 and node.kinds("rank_exit"), 20)
    by_rank = {e.rank: e for e in exits}
    assert by_rank[0].data["exit_code"] == 3
    assert by_rank[1].data["signal"] == signal.SIGKILL
    a.wait(5), b.wait(5)


def test_the_server_does_not_wake_while_nothing_happens(make_node) -> None:
    node = make_node()
    before = node.local.wakeups
    time.sleep(1.0)  # the window observed, not a synchronisation: the old loop woke 10 times
    assert node.local.wakeups == before


def test_a_stopped_rank_is_reported_heartbeat_lost_and_recovers(make_node, spawn) -> None:
    node = make_node(heartbeat_timeout_s=1.0, hang_min_s=30.0)
    p = spawn([RANK], node.local.socket_path)
    wait_for(lambda: p.pid in node.local.ranks and node.local.ranks[p.pid].last_step, timeout=20)
    p.send_signal(signal.SIGSTOP)  # alive, but neither steps nor heartbeats
    (lost,) = wait_for(lambda: node.kinds("heartbeat_lost"), timeout=20)
    assert lost.data["pid"] == p.pid and lost.data["age_s"] > 1.0
    assert not node.kinds("hang") and not node.kinds("rank_exit")
    p.send_signal(signal.SIGCONT)
    wait_for(lambda: not node.local.ranks[p.pid].heartbeat_lost_reported, timeout=20)
    assert node.local.ranks[p.pid].alive


def test_an_exited_rank_leaves_the_table_after_keep_exited_s(make_node, spawn) -> None:
    node = make_node(keep_exited_s=0.5)
    p = spawn([RANK, "--steps", "3"], node.local.socket_path)
    wait_for(lambda: node.kinds("rank_exit"), timeout=20)
    wait_for(lambda: p.pid not in node.local.ranks, timeout=20)
    assert node.local.rank_statuses() == []


def test_the_first_step_of_a_generation_and_a_slow_step_are_sent_at_once(make_node) -> None:
    # The executor acks `resumed` at the first step of every rank's new generation; with
    # an hour between regular flushes, only the at-once send can bring it.
    node = make_node()
    tg = sdk.attach(
        job="j",
        socket_path=node.local.socket_path,
        install_signal_handler=False,
        heartbeat_interval=3600,
        flush_interval=3600,
    )
    try:
        rec = wait_for(lambda: node.local.ranks.get(tg.pid), timeout=10)
        with tg.step(0):
            pass
        wait_for(lambda: rec.last_step == 0, timeout=10)
        sent = tg.sent
        with tg.step(1):  # a later step waits for the next flush
            pass
        assert tg.sent == sent and rec.last_step == 0
        tg.restart_iteration(1)  # sends step 1, then the new iteration
        wait_for(lambda: rec.iteration == 1 and rec.first_step_end_this_iteration is None, 10)
        assert rec.last_step == 1
        with tg.step(2):
            pass
        wait_for(lambda: rec.first_step_end_this_iteration is not None, timeout=10)
        assert rec.last_step == 2
        # after a raised restart, re-entering without a new iteration: sent at once too
        node.local.request_restart("j", "req-1")
        wait_for(lambda: tg.restart_requests == 1, timeout=10)
        with contextlib.suppress(sdk.RestartRequested), tg.step(3):
            pass
        with tg.step(3):
            pass
        wait_for(lambda: rec.last_step == 3, timeout=10)
        # a step ending a flush interval after the last send (a slow step): at once too
        end = time.time() + 3601
        tg.step_done(4, end - 1, end)
        wait_for(lambda: rec.last_step == 4, timeout=10)
    finally:
        tg.close()


def test_a_heartbeat_sent_before_an_in_process_restart_is_not_a_second_restart(
    make_node: Any,
) -> None:
    # CI: a heartbeat carrying the old iteration arrived after the iteration message;
    # the agent saw 0 -> 1 -> 0 -> 1 and reported three in-process restarts.
    import json
    import socket as socketlib

    node = make_node()
    sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_DGRAM)
    path = str(node.agent.config.socket_path)
    pid, t0 = os.getpid(), time.time()
    sent = [("hello", 0), ("iteration", 1), ("heartbeat", 0), ("heartbeat", 1)]
    try:
        for n, (kind, it) in enumerate(sent):
            msg = {
                "t": kind,
                "job": "job1",
                "rank": 0,
                "pid": pid,
                "world_size": 1,
                "ts": t0 + n,
                "iteration": it,
            }
            sock.sendto(json.dumps(msg).encode(), path)
        last = t0 + len(sent) - 1
        wait_for(lambda: getattr(node.local.ranks.get(pid), "last_heartbeat", None) == last, 10)
    finally:
        sock.close()
    assert node.local.ranks[pid].iteration == 1
    restarts = [e for e in node.kinds("restart") if e.data.get("level") == "in_process"]
    assert len(restarts) == 1
