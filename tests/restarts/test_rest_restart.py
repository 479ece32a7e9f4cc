"""A restart asked through the REST API reaches the ranks and is acknowledged phase by
phase: real `trainguard server` and `trainguard agent --simulate 2` processes, real rank
processes (torch-free) on the agent's SDK socket."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.invariants import check as check_invariants
from tests.support import AUTH, TOKEN, free_port, wait_for

from .conftest import HERE, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    procs: list[subprocess.Popen[bytes]] = []
    port = free_port()
    sock = str(tmp_path / "agent.sock")
    env = {**os.environ, "TRAINGUARD_ADMIN_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}

    def start(name: str, args: list[str], **extra: str) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"{name}.log").open("wb")
        p = subprocess.Popen(
            [sys.executable, *args],
            env={**env, **extra},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append(p)
        return p

    server = start(
        "server",
        ["-m", "trainguard.agent.cli", "server", "--port", str(port), "--log-level", "warning"],
        TRAINGUARD_DATA_DIR=str(tmp_path / "data"),
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert server.poll() is None, (tmp_path / "server.log").read_text()
        try:
            return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(ready, 60, 0.2)
    start(
        "agent",
        [
            "-m",
            "trainguard.agent.cli",
            "agent",
            "--server",
            url,
            "--token",
            TOKEN,
            "--node",
            "n1",
            "--simulate",
            "2",
            "--interval",
            "0.5",
        ],
        TRAINGUARD_AGENT_SOCKET_PATH=sock,
        TRAINGUARD_AGENT_SPOOL_DIR=str(tmp_path / "spool"),
    )
    wait_for(lambda: os.path.exists(sock), 30, 0.1)

    def rank_env(**extra: str) -> dict[str, str]:
        return {**env, "TRAINGUARD_AGENT_SOCKET": sock, "TRAINGUARD_JOB": "job1", **extra}

    yield {"url": url, "start": start, "rank_env": rank_env, "tmp": tmp_path}
    for p in reversed(procs):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    check_invariants(f"sqlite:///{tmp_path / 'data' / 'trainguard.db'}")


def job_is_live(url: str, ranks: int) -> bool:
    r = httpx.get(f"{url}/api/v1/jobs/job1", headers=AUTH, timeout=5)
    if r.status_code != 200:
        return False
    body = r.json()
    live = [x for x in body.get("ranks", []) if x.get("alive", True) and x.get("last_step")]
    return len(live) >= ranks


def restart_and_follow(url: str, level: str) -> dict[str, Any]:
    r = httpx.post(
        f"{url}/api/v1/jobs/job1/restarts",
        headers=AUTH,
        timeout=10,
        json={"level": level, "reason": f"test {level}"},
    )
    assert r.status_code == 202, r.text
    incident = r.json()["incident_id"]

    def resumed() -> dict[str, Any] | None:
        body = httpx.get(f"{url}/api/v1/incidents/{incident}", headers=AUTH, timeout=5).json()
        return body if body["timeline"].get("resumed_at") else None

    return wait_for(resumed, 90, 0.2)


def test_in_process_restart_through_the_api_reaches_the_ranks(stack) -> None:
    for r in (0, 1):
        stack["start"](
            f"rank{r}",
            [str(HERE / "rank_script.py")],
            **stack["rank_env"](RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r)),
        )
    wait_for(lambda: job_is_live(stack["url"], 2), 60, 0.3)
    body = restart_and_follow(stack["url"], "in_process")
    t = body["timeline"]
    assert t["delivered_at"] <= t["torn_down_at"] <= t["restarted_at"] <= t["resumed_at"]
    for r in (0, 1):
        log = (stack["tmp"] / f"rank{r}.log").read_text()
        assert "iteration 1" in log  # the rank raised RestartRequested and re-entered
    print(
        "in_process via REST:",
        {k: round(v - t["decided_at"], 3) for k, v in t.items() if v and t.get("decided_at")},
    )


def test_launcher_restart_through_the_api_replaces_the_workers(stack) -> None:
    launcher = stack["start"](
        "launcher", [str(HERE / "mini_launcher.py"), "2"], **stack["rank_env"]()
    )
    wait_for(lambda: job_is_live(stack["url"], 2), 60, 0.3)
    body = restart_and_follow(stack["url"], "launcher")
    t = body["timeline"]
    assert t["delivered_at"] <= t["torn_down_at"] <= t["restarted_at"] <= t["resumed_at"]
    assert launcher.poll() is None  # the workers were ended, not their launcher
