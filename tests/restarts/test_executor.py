"""The command executor against a stand-in backend transport, with real rank processes
and a real (torch-free) launcher."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from typing import Any

from tests.support import wait_for
from trainguard.agent.executors.loop import CommandLoop
from trainguard.agent.ranks.server import LocalServer
from trainguard.protocol.wire import Ack, Command

from .conftest import HERE

RANK = str(HERE / "rank_script.py")
LAUNCHER = str(HERE / "mini_launcher.py")


class BackendStandIn:
    """The two command endpoints, in memory: what the backend would serve."""

    def __init__(self) -> None:
        self.pending: queue.Queue[Command] = queue.Queue()
        self.acks: list[tuple[str, Ack]] = []
        self.polls = 0
        self._lock = threading.Lock()

    def poll(self, node: str, wait: float) -> list[Command]:
        self.polls += 1
        try:
            return [self.pending.get(timeout=min(wait, 0.2))]
        except queue.Empty:
            return []

    def ack(self, command_id: str, ack: Ack) -> None:
        with self._lock:
            self.acks.append((command_id, ack))

    def phases(self, command_id: str) -> list[str]:
        with self._lock:
            return [a.phase for cid, a in self.acks if cid == command_id]

    def times(self, command_id: str) -> list[float]:
        with self._lock:
            return [a.ts for cid, a in self.acks if cid == command_id]


def command(cid: str, action: str, **params: float) -> Command:
    return Command(
        id=cid,
        job="job1",
        action=action,
        node="n1",
        issued_at=time.time(),
        reason="test",
        params=params,
    )


def test_in_process_command_is_acked_phase_by_phase_and_runs_once(
    make_node, spawn, tmp_path
) -> None:
    node = make_node()
    ranks = [spawn([RANK], node.local.socket_path, RANK=str(r)) for r in (0, 1)]
    wait_for(
        lambda: all(
            (node.local.ranks.get(p.pid) or None) and node.local.ranks[p.pid].last_step
            for p in ranks
        ),
        timeout=20,
    )
    backend = BackendStandIn()
    loop = CommandLoop(node.agent, node.local, transport=backend, node="n1", spool_dir=tmp_path)
    loop.start()
    try:
        backend.pending.put(command("c1", "in_process"))
        wait_for(lambda: backend.phases("c1")[-1:] == ["resumed"], timeout=30)
        assert backend.phases("c1") == ["delivered", "torn_down", "restarted", "resumed"]
        ts = backend.times("c1")
        assert ts == sorted(ts), list(zip(backend.phases("c1"), ts, strict=True))
        assert all(node.local.ranks[p.pid].iteration == 1 for p in ranks)
        # re-delivered after a reconnect: acked again, not run again
        backend.pending.put(command("c1", "in_process"))
        wait_for(lambda: len(backend.phases("c1")) == 5, timeout=10)
        assert backend.acks[-1][1].detail == "already executed"
        # A command for a fault of iteration 0, once every rank is past it (NVRx restarted
        # them on its own): the phases are acked with that restart's times, no new restart.
        backend.pending.put(command("c3", "in_process", attempt=0, iteration=0))
        wait_for(lambda: backend.phases("c3")[-1:] == ["resumed"], timeout=20)
        assert backend.phases("c3") == ["delivered", "torn_down", "restarted", "resumed"]
        assert "already restarted" in backend.acks[-1][1].detail
        assert all(node.local.ranks[p.pid].iteration == 1 for p in ranks)
        # Past the fault's generation by number, but the ranks' iteration started before
        # the fault (another node's numbering, a spare's): not its restart, it is run.
        later = time.time()
        backend.pending.put(command("c4", "in_process", attempt=0, iteration=0, fault_at=later))
        wait_for(lambda: backend.phases("c4")[-1:] == ["resumed"], timeout=30)
        assert "already restarted" not in backend.acks[-1][1].detail
        assert all(node.local.ranks[p.pid].iteration == 2 for p in ranks)
    finally:
        loop.stop()
    # a restarted agent remembers it too (the spool directory)
    again = CommandLoop(node.agent, node.local, transport=backend, node="n1", spool_dir=tmp_path)
    assert again.handle(command("c1", "in_process")) is None
    assert all(node.local.ranks[p.pid].iteration == 2 for p in ranks)


def test_launcher_command_ends_the_workers_not_the_launcher(make_node, spawn, tmp_path) -> None:
    node = make_node()
    launcher = spawn([LAUNCHER, "2"], node.local.socket_path)
    wait_for(lambda: len([r for r in node.local.job_ranks("job1") if r.last_step]) == 2, 20)
    old = {r.pid for r in node.local.job_ranks("job1")}
    backend = BackendStandIn()
    loop = CommandLoop(node.agent, node.local, transport=backend, node="n1", spool_dir=tmp_path)
    loop.start()
    try:
        backend.pending.put(command("c2", "launcher", grace_s=2.0))
        wait_for(lambda: backend.phases("c2")[-1:] in (["resumed"], ["failed"]), timeout=40)
        assert backend.phases("c2") == ["delivered", "torn_down", "restarted", "resumed"]
        assert launcher.poll() is None  # the launcher lives on
        new = {r.pid for r in node.local.job_ranks("job1")}
        assert len(new) == 2 and not new & old
        assert {r.attempt for r in node.local.job_ranks("job1")} == {1}
        assert [e for e in node.kinds("restart") if e.data.get("level") == "launcher"]
    finally:
        loop.stop()


def test_a_command_for_a_job_without_ranks_here_fails_with_a_reason(make_node, tmp_path) -> None:
    node = make_node()
    backend = BackendStandIn()
    loop = CommandLoop(node.agent, node.local, transport=backend, node="n1", spool_dir=tmp_path)
    t = loop.handle(command("c3", "in_process"))
    assert t is not None
    t.join(10)
    assert backend.phases("c3") == ["delivered", "failed"]
    assert "no live rank" in backend.acks[-1][1].detail


def _launch_and_kill_a_worker(node: Any, spawn: Any, delay: float) -> tuple[Any, set[int]]:
    """A launcher of 2 workers that holds its new workers back `delay` s; SIGKILL one of
    its workers (ft_launcher then stops the other and restarts the group)."""
    launcher = spawn(
        [LAUNCHER, "2"], node.local.socket_path, MINI_LAUNCHER_RESTART_DELAY=str(delay)
    )
    wait_for(lambda: len([r for r in node.local.job_ranks("job1") if r.last_step]) == 2, 20)
    old = {r.pid for r in node.local.job_ranks("job1")}
    os.kill(min(old), signal.SIGKILL)
    return launcher, old


def test_commands_finding_the_launcher_mid_restart_ack_its_restart_not_failed(
    make_node, spawn, tmp_path
) -> None:
    # The benchmark's sequence: a rank is SIGKILLed; by the time the engine's in_process
    # command (for the survivors' exceptions) and then its launcher command arrive, the
    # launcher has stopped the node's other worker and is starting a new generation.
    node = make_node()
    launcher, old = _launch_and_kill_a_worker(node, spawn, delay=2.0)
    wait_for(lambda: not node.local.job_ranks("job1"), timeout=10)  # no live rank here
    backend = BackendStandIn()
    loop = CommandLoop(node.agent, node.local, transport=backend, node="n1", spool_dir=tmp_path)
    loop.start()
    try:
        backend.pending.put(command("c1", "in_process", attempt=0, iteration=0))
        backend.pending.put(command("c2", "launcher", attempt=0, iteration=0, grace_s=2.0))
        for cid in ("c1", "c2"):
            wait_for(lambda cid=cid: backend.phases(cid)[-1:] in (["resumed"], ["failed"]), 40)
            assert backend.phases(cid) == ["delivered", "torn_down", "restarted", "resumed"], [
                a for c, a in backend.acks if c == cid
            ]
            resumed = [a for c, a in backend.acks if c == cid and a.phase == "resumed"]
            assert "launcher" in resumed[0].detail  # who did the restart
            # The launcher's own times: its teardown may precede the command's delivery.
            ts = backend.times(cid)[1:]
            assert ts == sorted(ts)
        assert launcher.poll() is None
        new = node.local.job_ranks("job1")
        assert len(new) == 2 and not {r.pid for r in new} & old
        # The launcher command followed the launcher's restart: no second one.
        assert {r.attempt for r in new} == {1}
    finally:
        loop.stop()


def test_ranks_dying_during_an_in_process_restart_follow_the_launcher(
    make_node, spawn, tmp_path
) -> None:
    # One rank is stuck (stopped) when the command comes, so the restart request reaches
    # only its peer; it dies while the peer restarts in process, and its launcher ends the
    # peer and restarts the group. (The agent sees an exit at once, so the rank is killed
    # after the command took the job's ranks, not before.)
    node = make_node()
    backend = BackendStandIn()
    loop = CommandLoop(node.agent, node.local, transport=backend, node="n1", spool_dir=tmp_path)
    launcher = spawn([LAUNCHER, "2"], node.local.socket_path, MINI_LAUNCHER_RESTART_DELAY="1.0")
    wait_for(lambda: len([r for r in node.local.job_ranks("job1") if r.last_step]) == 2, 20)
    old = {r.pid for r in node.local.job_ranks("job1")}
    stuck = min(old)
    os.kill(stuck, signal.SIGSTOP)
    t = loop.handle(command("c1", "in_process", attempt=0, iteration=0))
    assert t is not None
    wait_for(lambda: "torn_down" in backend.phases("c1"), timeout=20)  # the peer raised
    os.kill(stuck, signal.SIGKILL)
    t.join(40)
    acks = [a for c, a in backend.acks if c == "c1"]
    assert [a.phase for a in acks] == ["delivered", "torn_down", "restarted", "resumed"], acks
    assert "launcher" in acks[-1].detail
    new = node.local.job_ranks("job1")
    assert {r.attempt for r in new} == {1} and not {r.pid for r in new} & old
    assert launcher.poll() is None


def test_a_launcher_restart_fails_at_once_when_the_launcher_gives_up(
    make_node, spawn, tmp_path
) -> None:
    # Its restart budget spent (here 0), the launcher ends its workers and exits instead
    # of starting new ones: the command fails within relaunch_grace_s of that, saying so,
    # not after restarted_timeout_s with no end.
    node = make_node()
    launcher = spawn([LAUNCHER, "2"], node.local.socket_path, MINI_LAUNCHER_MAX_RESTARTS="0")
    wait_for(lambda: len([r for r in node.local.job_ranks("job1") if r.last_step]) == 2, 20)
    backend = BackendStandIn()
    loop = CommandLoop(
        node.agent,
        node.local,
        transport=backend,
        node="n1",
        relaunch_grace_s=0.5,
        restarted_timeout_s=600.0,
    )
    t = loop.handle(command("c1", "launcher", grace_s=2.0))
    assert t is not None
    t.join(60)
    assert not t.is_alive()  # done long before restarted_timeout_s
    assert backend.phases("c1") == ["delivered", "torn_down", "failed"]
    assert "exited and their launcher is gone" in backend.acks[-1][1].detail
    assert launcher.wait(10) == 1


def test_an_excluded_node_leaves_the_job_through_its_launcher(make_node, spawn, tmp_path) -> None:
    # exclude_node ends the job's launcher here (SIGTERM, passed on to its workers), not
    # only its workers: nothing of the job is left on the node to rejoin the next round.
    # The workers' exits say it was the exclusion (no new fault).
    node = make_node()
    launcher = spawn([LAUNCHER, "2"], node.local.socket_path)
    wait_for(lambda: len([r for r in node.local.job_ranks("job1") if r.last_step]) == 2, 20)
    workers = {r.pid for r in node.local.job_ranks("job1")}
    backend = BackendStandIn()
    loop = CommandLoop(node.agent, node.local, transport=backend, node="n1")
    t = loop.handle(command("x1", "exclude_node", grace_s=10.0))
    assert t is not None
    t.join(30)
    assert backend.phases("x1") == ["delivered", "torn_down"]
    assert backend.acks[-1][1].detail == f"ended pid {launcher.pid} with SIGTERM"
    assert launcher.wait(5) == 0
    assert not node.local.job_ranks("job1")
    wait_for(lambda: {e.data.get("pid") for e in node.kinds("rank_exit")} >= workers, 10)
    assert {e.data.get("signalled_by") for e in node.kinds("rank_exit")} == {"exclude_node x1"}


def test_a_launcher_that_ignores_sigterm_is_killed_after_the_grace(
    make_node, spawn, tmp_path
) -> None:
    node = make_node()
    launcher = spawn([LAUNCHER, "2"], node.local.socket_path, MINI_LAUNCHER_IGNORE_TERM="1")
    wait_for(lambda: len([r for r in node.local.job_ranks("job1") if r.last_step]) == 2, 20)
    backend = BackendStandIn()
    loop = CommandLoop(node.agent, node.local, transport=backend, node="n1")
    t = loop.handle(command("x2", "exclude_node", grace_s=1.0))
    assert t is not None
    t.join(30)
    assert backend.phases("x2") == ["delivered", "torn_down"]
    detail = backend.acks[-1][1].detail
    assert f"pid {launcher.pid} ignored SIGTERM for 1 s and was killed" in detail, detail
    assert launcher.wait(5) == -signal.SIGKILL
    wait_for(lambda: not node.local.job_ranks("job1"), 10)


def test_a_command_right_after_an_agent_restart_waits_for_its_ranks_to_register(
    make_node, spawn, tmp_path
) -> None:
    # bench chaos (#33): a node's agent restarted while its ranks trained, and the
    # launcher restart that waited for it was judged at once, before the ranks' next
    # heartbeat registered them with the new agent: "no live rank", then stop_job of a
    # job that trained on.
    node = make_node()
    spawn([LAUNCHER, "2"], node.local.socket_path)
    wait_for(lambda: len([r for r in node.local.job_ranks("job1") if r.last_step]) == 2, 20)
    node.local.stop()
    restarted = LocalServer(node.agent, socket_path=str(node.local.socket_path))
    restarted.start()
    try:
        assert restarted.job_ranks("job1") == []  # nothing known yet
        backend = BackendStandIn()
        loop = CommandLoop(node.agent, restarted, transport=backend, node="n1")
        t = loop.handle(command("c1", "launcher", grace_s=2.0))
        assert t is not None
        t.join(60)
        assert backend.phases("c1") == ["delivered", "torn_down", "restarted", "resumed"], [
            a for c, a in backend.acks if c == "c1"
        ]
    finally:
        restarted.stop()


def test_workers_gone_without_a_launcher_fail_after_the_grace(make_node, spawn, tmp_path) -> None:
    node = make_node()
    ranks = [spawn([RANK], node.local.socket_path, RANK=str(r)) for r in (0, 1)]
    wait_for(lambda: len([r for r in node.local.job_ranks("job1") if r.last_step]) == 2, 20)
    for p in ranks:
        p.kill()
        p.wait()
    wait_for(lambda: not node.local.job_ranks("job1"), timeout=10)
    backend = BackendStandIn()
    loop = CommandLoop(node.agent, node.local, transport=backend, node="n1", relaunch_grace_s=0.5)
    t = loop.handle(command("c1", "launcher"))
    assert t is not None
    t.join(10)
    assert backend.phases("c1") == ["delivered", "failed"]
    assert "exited and their launcher is gone" in backend.acks[-1][1].detail


def _wait_stuck_in_step(node: Any, count: int, step: int) -> set[int]:
    """Wait until `count` ranks of job1 completed `step` - 1 (run with --hang-at `step`:
    each then hangs inside that step, in every iteration, while it heartbeats)."""
    wait_for(
        lambda: len([r for r in node.local.job_ranks("job1") if r.last_step == step - 1]) == count,
        timeout=20,
    )
    return {r.pid for r in node.local.job_ranks("job1")}


def test_ranks_ended_by_the_launcher_before_their_first_step_follow_its_restart(
    make_node, spawn, tmp_path
) -> None:
    # A rank dies before the command comes, while its launcher has not noticed yet
    # (stopped here; ft_launcher polls). The survivor restarts in process (torn_down,
    # restarted) and hangs before its first step; the launcher then ends it and restarts
    # the group. The command follows that restart instead of waiting out resumed_timeout_s.
    node = make_node()
    backend = BackendStandIn()
    loop = CommandLoop(
        node.agent,
        node.local,
        transport=backend,
        node="n1",
        spool_dir=tmp_path,
        resumed_timeout_s=30.0,
    )
    launcher = spawn(
        [LAUNCHER, "2", "--hang-at", "5"],
        node.local.socket_path,
        MINI_LAUNCHER_RESTART_DELAY="0.5",
    )
    old = _wait_stuck_in_step(node, 2, 5)
    os.kill(launcher.pid, signal.SIGSTOP)
    try:
        os.kill(min(old), signal.SIGKILL)
        wait_for(lambda: len(node.local.job_ranks("job1")) == 1, timeout=10)
        t = loop.handle(command("c1", "in_process", attempt=0, iteration=0))
        assert t is not None
        wait_for(lambda: "restarted" in backend.phases("c1"), timeout=20)
    finally:
        os.kill(launcher.pid, signal.SIGCONT)
    t.join(60)
    acks = [a for c, a in backend.acks if c == "c1"]
    assert [a.phase for a in acks] == ["delivered", "torn_down", "restarted", "resumed"], acks
    assert "launcher" in acks[-1].detail
    assert [a.ts for a in acks[1:]] == sorted(a.ts for a in acks[1:])
    new = node.local.job_ranks("job1")
    assert len(new) == 2 and {r.attempt for r in new} == {1} and not {r.pid for r in new} & old
    assert launcher.poll() is None


def test_ranks_dying_before_their_first_step_without_a_launcher_fail_after_the_grace(
    make_node, spawn, tmp_path
) -> None:
    node = make_node()
    ranks = [spawn([RANK, "--hang-at", "5"], node.local.socket_path, RANK=str(r)) for r in (0, 1)]
    _wait_stuck_in_step(node, 2, 5)
    backend = BackendStandIn()
    loop = CommandLoop(
        node.agent,
        node.local,
        transport=backend,
        node="n1",
        relaunch_grace_s=0.5,
        resumed_timeout_s=30.0,
    )
    t = loop.handle(command("c1", "in_process"))
    assert t is not None
    wait_for(lambda: "restarted" in backend.phases("c1"), timeout=20)
    for p in ranks:
        p.kill()
        p.wait()
    t.join(20)
    assert backend.phases("c1") == ["delivered", "torn_down", "restarted", "failed"]
    assert "exited and their launcher is gone" in backend.acks[-1][1].detail
