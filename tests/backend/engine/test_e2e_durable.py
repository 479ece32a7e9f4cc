"""A decision outlives a backend restart and is carried out once: real `trainguard
server` processes, a real `trainguard agent --simulate 2` and real rank processes on its
SDK socket.

The agent is down when the engine decides, the backend restarts before the agent is
back, and the command still reaches the ranks: one in-process restart, acked phase by
phase, and the incident resolved."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.invariants import check as check_invariants
from tests.support import AUTH, TOKEN, free_port, wait_for
from trainguard.protocol import wire

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[3]
RANK_SCRIPT = ROOT / "tests" / "restarts" / "rank_script.py"


class Stack:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.sock = str(tmp / "agent.sock")
        self.spool = tmp / "spool"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {
            **os.environ,
            "TRAINGUARD_ADMIN_TOKEN": TOKEN,
            "PYTHONPATH": str(ROOT),
            # Long enough that the agent's absence is no node_down during the test.
            "TRAINGUARD_NODE_DOWN_AFTER_S": "120",
            "TRAINGUARD_DATA_DIR": str(tmp / "data"),
        }

    def start(self, name: str, args: list[str], **extra: str) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{name}.log").open("ab")
        p = subprocess.Popen(
            [sys.executable, *args],
            env={**self.env, **extra},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(p)
        return p

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def server(self) -> subprocess.Popen[bytes]:
        p = self.start(
            "server",
            [
                *("-m", "trainguard.agent.cli", "server"),
                *("--port", str(self.port), "--log-level", "warning"),
            ],
        )

        def ready() -> bool:
            assert p.poll() is None, self.log("server")
            try:
                return httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, 60, 0.1)
        return p

    def agent(self) -> subprocess.Popen[bytes]:
        return self.start(
            "agent",
            [
                *("-m", "trainguard.agent.cli", "agent", "--server", self.url, "--token", TOKEN),
                *("--node", "n1", "--simulate", "2", "--interval", "0.5"),
            ],
            TRAINGUARD_AGENT_SOCKET_PATH=self.sock,
            TRAINGUARD_AGENT_SPOOL_DIR=str(self.spool),
        )

    def rank(self, r: int) -> subprocess.Popen[bytes]:
        return self.start(
            f"rank{r}",
            [str(RANK_SCRIPT), "--step-s", "0.05"],
            TRAINGUARD_AGENT_SOCKET=self.sock,
            TRAINGUARD_JOB="job1",
            RANK=str(r),
            WORLD_SIZE="2",
            LOCAL_RANK=str(r),
        )

    def api(self, path: str, **params: Any) -> Any:
        r = httpx.get(f"{self.url}/api/v1{path}", headers=AUTH, params=params, timeout=10)
        r.raise_for_status()
        return r.json()

    @staticmethod
    def stop(p: subprocess.Popen[bytes]) -> None:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path)
    yield s
    for p in reversed(s.procs):
        s.stop(p)
    check_invariants(f"sqlite:///{tmp_path / 'data' / 'trainguard.db'}")


def test_a_decision_survives_a_backend_restart_and_runs_once(stack: Stack) -> None:
    server = stack.server()
    agent = stack.agent()
    wait_for(lambda: os.path.exists(stack.sock), 30, 0.05)
    for r in (0, 1):
        stack.rank(r)

    def live() -> bool:
        try:
            ranks = stack.api("/jobs/job1")["ranks"]
        except httpx.HTTPStatusError:
            return False
        return len([x for x in ranks if x["alive"] and x["last_step"]]) == 2

    wait_for(live, 60, 0.2)

    # The agent goes away (its ranks train on); then a rank's exception is reported.
    stack.stop(agent)
    now = time.time()
    batch = wire.Batch(
        node="n1",
        agent_id="test-reporter-1",
        seq=1,
        sent_at=now,
        events=[wire.Event(kind="exception", ts=now, job="job1", rank=0, message="boom")],
    )
    r = httpx.post(
        f"{stack.url}/api/v1/ingest", content=wire.encode(batch), headers=AUTH, timeout=10
    )
    assert r.status_code == 200, r.text
    (inc,) = wait_for(lambda: stack.api("/incidents", job="job1"), 20, 0.05)
    assert inc["trigger"] == "auto" and inc["level"] == "in_process"
    (cmd,) = inc["commands"]
    assert cmd["node"] == "n1" and cmd["delivered_at"] is None

    # The backend restarts; the agent comes back while it is down.
    stack.stop(server)
    stack.agent()
    wait_for(lambda: stack.log("agent").count("command poll failed") >= 1, 60, 0.05)
    stack.server()

    def resolved() -> dict[str, Any] | None:
        body = stack.api(f"/incidents/{inc['id']}")
        return body if body["status"] != "open" else None

    done = wait_for(resolved, 120, 0.2)
    assert done["status"] == "resolved", done
    (cmd,) = done["commands"]
    phases = [(a["phase"], a["detail"]) for a in cmd["acks"]]
    assert phases[0] == ("delivered", "")  # delivered once, executed that time
    assert [p for p, _ in phases] == ["delivered", "torn_down", "restarted", "resumed"]
    t = done["timeline"]
    assert t["fault_at"] <= t["decided_at"] <= t["delivered_at"] <= t["resumed_at"]
    done_log = (stack.spool / "commands-done.log").read_text().split()
    assert done_log.count(cmd["id"]) == 1
    for r in (0, 1):
        assert stack.log(f"rank{r}").count("restart requested") == 1
