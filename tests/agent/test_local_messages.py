"""The agent's SDK server with typed messages: what each message type does to the rank
table and the outbox, and what happens to a datagram it cannot use (counted, said in a
rate-limited log line, and the server goes on)."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import wait_for
from trainguard import sdk
from trainguard.agent.config import AgentConfig
from trainguard.agent.daemon import Agent, build_agent
from trainguard.agent.ranks.server import LocalServer, RejectLog
from trainguard.protocol import messages as m


class Node:
    def __init__(self, agent: Agent, local: LocalServer) -> None:
        self.agent, self.local = agent, local
        self.events: list[Any] = []
        self.steps: list[Any] = []

    def kinds(self, kind: str) -> list[Any]:
        drained = self.agent.outbox.drain(10**6, 10**6, 10**6)
        self.events += drained.events
        self.steps += drained.steps
        return [e for e in self.events if e.kind == kind]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    cfg = AgentConfig(
        node="n1",
        simulate=2,
        spool_dir=tmp_path / "spool",
        socket_path=tmp_path / "agent.sock",
        kmsg_path=None,
    )
    agent = build_agent(cfg)
    local = LocalServer(agent)
    local.start()
    yield Node(agent, local)
    local.stop()


@pytest.fixture
def sender() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    yield sock
    sock.close()


def hello(pid: int, **kw: Any) -> bytes:
    return m.encode(m.Hello(job="job1", rank=0, pid=pid, **kw))


def test_each_message_type_of_a_session_reaches_the_table_and_the_outbox(node: Node) -> None:
    tg = sdk.Session(
        job="job1",
        rank=2,
        local_rank=0,
        world_size=4,
        attempt=0,
        socket_path=node.local.socket_path,
        install_signal_handler=False,
        launcher="slurm",
        in_process=False,
        display_name="nightly",
    )
    try:
        rec = wait_for(lambda: node.local.ranks.get(tg.pid), timeout=10)
        assert (rec.rank, rec.world_size, rec.launcher, rec.display_name) == (
            2,
            4,
            "slurm",
            "nightly",
        )
        (start,) = node.kinds("rank_start")
        assert start.data["pid"] == tg.pid and start.rank == 2
        with tg.step(0), tg.compute():
            pass
        tg.step_done(1, 10.0, 11.0, compute=0.25)
        tg.flush()
        wait_for(lambda: rec.last_step == 1, timeout=10)
        with tg.checkpoint("save", step=1):
            wait_for(lambda: rec.in_checkpoint, timeout=10)
        wait_for(lambda: not rec.in_checkpoint, timeout=10)
        tg.log("lr changed", lr=0.1, nested={"dropped": True})
        tg.report_interrupted("a peer failed")
        wait_for(lambda: rec.restarting, timeout=10)
        tg.restart_iteration(1)
        wait_for(lambda: rec.iteration == 1 and not rec.restarting, timeout=10)
        tg.report_exception(ValueError("bad batch"))
        tg.inject_xid(1, 79, "fault injection")
        tg.finished()
        wait_for(lambda: rec.finished, timeout=10)
        assert node.local.request_restart("job1", "req-1", "test") == [tg.pid]
        wait_for(lambda: tg.restart_requests == 1, timeout=10)
        with pytest.raises(sdk.RestartRequested):
            tg.check_restart()
        wait_for(lambda: "req-1" in rec.restart_raised, timeout=10)
    finally:
        tg.close()
    wait_for(lambda: rec.said_bye, timeout=10)
    assert rec.clean_exit and rec.alive  # a bye, and the process still runs
    node.kinds("")  # collects the steps too
    assert [(s.step, s.compute) for s in node.steps][1] == (1, 0.25)
    assert node.steps[0].compute is not None and node.steps[0].iteration == 0
    phases = [e.data["phase"] for e in node.kinds("checkpoint")]
    assert phases == ["save_start", "save_end"]
    (line,) = [e for e in node.kinds("log") if e.message == "lr changed"]
    assert line.data == {"lr": 0.1}  # scalars only
    (exc,) = node.kinds("exception")
    assert exc.data["type"] == "ValueError" and "bad batch" in exc.message
    (xid,) = wait_for(lambda: node.kinds("xid"), timeout=10)
    assert xid.xid == 79 and node.agent.simulated.is_lost(1)
    levels = [e.data.get("level") or e.data.get("phase") for e in node.kinds("restart")]
    assert levels == ["in_process", "raised"]
    assert node.local.rejected == {} and node.local.unknown_senders == 0


def test_an_unusable_datagram_is_counted_said_once_and_the_server_goes_on(
    node: Node, sender: socket.socket, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trainguard.agent.ranks.server")
    path = node.local.socket_path
    version_2 = hello(os.getppid()).replace(b'"version":1', b'"version":2')
    for data in [b"\x00garbage", b'{"t":"teleport"}', b'{"t":"hello","job":"j"}', version_2]:
        sender.sendto(data, path)
    sender.sendto(version_2, path)
    sender.sendto(hello(os.getpid()), path)  # a good one, after the bad ones
    rec = wait_for(lambda: node.local.ranks.get(os.getpid()), timeout=10)
    assert rec.job == "job1" and os.getppid() not in node.local.ranks
    assert node.local.rejected == {"malformed": 3, "version": 2}
    lines = [r.getMessage() for r in caplog.records if r.name == "trainguard.agent.ranks.server"]
    assert len(lines) == 1, lines  # the first rejection is said; the rest wait their turn
    assert "1 datagram(s) rejected (1 malformed)" in lines[0]


def test_a_message_from_an_address_no_rank_registered_from_is_counted(
    node: Node, sender: socket.socket
) -> None:
    sender.sendto(m.encode(m.Finished(step=1)), node.local.socket_path)
    wait_for(lambda: node.local.unknown_senders == 1, timeout=10)
    assert node.local.ranks == {}


def test_a_bad_declaration_is_dropped_and_the_rank_kept(node: Node, sender: socket.socket) -> None:
    sender.sendto(
        hello(os.getpid(), launcher="mpirun", in_process="yes", display_name="a/b c"),
        node.local.socket_path,
    )
    rec = wait_for(lambda: node.local.ranks.get(os.getpid()), timeout=10)
    assert (rec.launcher, rec.in_process, rec.display_name) == (None, None, None)


def test_rejections_are_said_at_most_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="trainguard.agent.ranks.server")
    now = [100.0]
    rejects = RejectLog(every=60.0, clock=lambda: now[0])
    malformed, version = m.Rejected("malformed", "not JSON"), m.Rejected("version", "version 2")
    rejects.add(malformed)  # said at once
    for _ in range(5):
        rejects.add(version)
    now[0] += 59.0
    rejects.add(malformed)  # still inside the interval
    assert rejects.lines == 1
    now[0] += 2.0
    rejects.add(version)  # the next line counts what came since the last one
    assert rejects.lines == 2 and rejects.counts == {"malformed": 2, "version": 6}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "7 datagram(s) rejected (1 malformed, 6 version), the last: version" in lines[1]
