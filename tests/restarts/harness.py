"""Run the demo job on this machine the way `trainguard demo` does (two agents' SDK servers,
an agent-hosted Wrapper store, two ft_launchers x 2 ranks) and measure restarts from what
the agents saw. Used by the slow tests and by bench_restarts.py."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.agent.config import AgentConfig
from trainguard.agent.daemon import Agent, build_agent
from trainguard.agent.executors.storehost import StoreHost
from trainguard.agent.ranks.server import LocalServer
from trainguard.backend import demojob

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "train_demo.py"


@dataclass
class NodeView:
    agent: Agent
    local: LocalServer
    events: list[Any] = field(default_factory=list)
    steps: list[Any] = field(default_factory=list)

    def collect(self) -> None:
        d = self.agent.outbox.drain(10**6, 10**6, 10**6)
        self.events += d.events
        self.steps += d.steps


@dataclass
class Cluster:
    workdir: Path
    nodes: list[NodeView]
    store: StoreHost
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def collect(self) -> Cluster:
        for n in self.nodes:
            n.collect()
        return self

    @property
    def events(self) -> list[Any]:
        return [e for n in self.nodes for e in n.events]

    @property
    def steps(self) -> list[Any]:
        return [s for n in self.nodes for s in n.steps]

    def kinds(self, kind: str) -> list[Any]:
        self.collect()
        return [e for e in self.events if e.kind == kind]

    def wait(self, timeout: float) -> list[int | None]:
        """Wait for every launched process to end (a deadline, not a sleep)."""
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        self.collect()
        return [p.poll() for p in self.procs]

    def logs(self) -> str:
        return "\n".join(
            f"--- {f.name}\n{f.read_text(errors='replace')[-6000:]}"
            for f in sorted(self.workdir.glob("*.log"))
        )

    def close(self) -> None:
        demojob.stop(self.procs, grace=10)
        for n in self.nodes:  # and any worker the launchers left behind
            for pid in list(n.local.ranks):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if n.local.ranks[pid].alive:
                        os.kill(pid, signal.SIGKILL)
        for n in self.nodes:
            n.local.stop()
        self.store.stop()


def start_nodes(workdir: Path, count: int, **local_kw: Any) -> tuple[list[NodeView], StoreHost]:
    workdir.mkdir(parents=True, exist_ok=True)
    store = StoreHost(port=demojob.free_port())
    store.start()
    nodes = []
    for i in range(count):
        cfg = AgentConfig(
            node=f"node{i}",
            simulate=2,
            spool_dir=workdir / f"spool{i}",
            socket_path=workdir / f"agent{i}.sock",
            kmsg_path=None,
        )
        agent = build_agent(cfg)
        local = LocalServer(agent, **local_kw)
        local.start()
        nodes.append(NodeView(agent, local))
    return nodes, store


def launch_demo(workdir: Path, **kw: Any) -> Cluster:
    """Two ft_launchers x 2 ranks, each launcher reporting to its own agent."""
    nodes, store = start_nodes(workdir, 2)
    cluster = Cluster(workdir, nodes, store)
    cluster.procs = demojob.launch(workdir, [n.local.socket_path for n in nodes], store.port, **kw)
    return cluster


def launch_plain(workdir: Path, world: int, train_args: list[str]) -> Cluster:
    """`world` ranks as plain processes (no launcher), all on one agent."""
    nodes, store = start_nodes(workdir, 1)
    cluster = Cluster(workdir, nodes, store)
    for r in range(world):
        env = dict(
            os.environ,
            RANK=str(r),
            LOCAL_RANK=str(r),
            WORLD_SIZE=str(world),
            TRAINGUARD_AGENT_SOCKET=nodes[0].local.socket_path,
            TRAINGUARD_JOB="plain",
            OMP_NUM_THREADS="1",
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
        )
        log = open(workdir / f"rank-{r}.log", "ab")  # noqa: SIM115 - owned by the child
        cluster.procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(TRAIN),
                    "--workdir",
                    str(workdir),
                    "--job",
                    "plain",
                    "--store-port",
                    str(store.port),
                    *train_args,
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        log.close()
    return cluster


def fault_time(cluster: Cluster) -> float:
    """When the injected fault fired (the rank reports it just before)."""
    (ev,) = [e for e in cluster.kinds("log") if e.message.startswith("injecting fault")]
    return float(ev.ts)


def recovery_s(cluster: Cluster, fault_at: float, restarted_only: bool = False) -> float:
    """Fault to the next completed step, of the slowest rank. With restarted_only, only
    steps after a restart count (a command can arrive while a step completes)."""
    firsts: dict[int, float] = {}
    for s in cluster.collect().steps:
        if restarted_only and not (s.attempt or s.iteration):
            continue
        if s.end > fault_at and (s.rank not in firsts or s.end < firsts[s.rank]):
            firsts[s.rank] = s.end
    return max(firsts.values()) - fault_at
