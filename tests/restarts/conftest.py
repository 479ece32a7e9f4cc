"""Fixtures for the restart tests: a real node agent (simulated GPUs, not running its
uplink) with the SDK server started on a socket of its own, and rank processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trainguard.agent.config import AgentConfig
from trainguard.agent.daemon import Agent, build_agent
from trainguard.agent.ranks.server import LocalServer
from trainguard.agent.uplink.outbox import Drained

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


class Node:
    """One agent and everything it has put in its outbox so far."""

    def __init__(self, agent: Agent, local: LocalServer) -> None:
        self.agent, self.local = agent, local
        self.events: list[Any] = []
        self.steps: list[Any] = []

    def collect(self) -> Node:
        d: Drained = self.agent.outbox.drain(10**6, 10**6, 10**6)
        self.events += d.events
        self.steps += d.steps
        return self

    def kinds(self, kind: str) -> list[Any]:
        self.collect()
        return [e for e in self.events if e.kind == kind]


@pytest.fixture
def make_node(tmp_path: Path) -> Iterator[Callable[..., Node]]:
    started: list[LocalServer] = []

    def make(name: str = "n1", **local_kw: Any) -> Node:
        cfg = AgentConfig(
            node=name,
            simulate=2,
            spool_dir=tmp_path / f"spool-{name}",
            socket_path=tmp_path / f"{name}.sock",
            kmsg_path=None,
        )
        agent = build_agent(cfg)
        local = LocalServer(agent, **local_kw)
        local.start()
        started.append(local)
        return Node(agent, local)

    yield make
    for local in started:
        local.stop()


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def run(args: list[str], sock: str | os.PathLike[str], **env: str) -> subprocess.Popen[bytes]:
        full_env = dict(
            os.environ,
            TRAINGUARD_AGENT_SOCKET=str(sock),
            TRAINGUARD_JOB="job1",
            PYTHONPATH=str(ROOT),
            **env,
        )
        p = subprocess.Popen([sys.executable, *args], env=full_env, start_new_session=True)
        procs.append(p)
        return p

    yield run
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
