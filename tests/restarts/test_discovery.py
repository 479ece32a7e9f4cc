"""Zero-config discovery with real processes: `trainguard agent --node X` on a host named
otherwise, a rank with no trainguard settings at all, and the HTTP wire between the agent
and a recording ingest endpoint. The well-known socket folders are moved into the test's
own folder (TRAINGUARD_SOCKET_DIRS), so nothing here needs /run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support import wait_for
from trainguard.protocol.wire import Batch, RankStatus, decode_batch

from .conftest import HERE, ROOT

RANK = str(HERE / "rank_script.py")
# What a user's shell may hold that would bypass discovery or name the job.
SETTINGS = ("TRAINGUARD_AGENT_SOCKET", "TRAINGUARD_AGENT_SOCKET_PATH", "TRAINGUARD_JOB")


class Ingest:
    """A recording stand-in for the backend's ingest and command routes (real HTTP)."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                batch = decode_batch(body)
                with outer.lock:
                    outer.batches.append(batch)
                self._answer({"seq": batch.seq, "duplicate": False})

            def do_GET(self) -> None:  # the command long-poll: nothing to do
                outer.stopping.wait(0.5)
                self._answer([])

            def _answer(self, doc: Any) -> None:
                data = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ranks(self, pid: int) -> list[RankStatus]:
        with self.lock:
            return [r for b in self.batches for r in b.ranks or [] if r.pid == pid]

    def events(self, kind: str) -> list[Any]:
        with self.lock:
            return [e for b in self.batches for e in b.events if e.kind == kind]

    def close(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def ingest() -> Iterator[Ingest]:
    stub = Ingest()
    yield stub
    stub.close()


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    env.update(
        PYTHONPATH=str(ROOT),
        TRAINGUARD_SOCKET_DIRS=f"{tmp_path / 'run'}{os.pathsep}{tmp_path / 'user'}",
        **extra,
    )
    return env


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def start_agent(tmp_path: Path, ingest: Ingest, procs: list[Any], node: str) -> Path:
    log = tmp_path / f"agent-{node}.log"
    env = clean_env(
        tmp_path,
        TRAINGUARD_AGENT_CONFIG=str(tmp_path / "absent.toml"),
        TRAINGUARD_AGENT_SPOOL_DIR=str(tmp_path / f"spool-{node}"),
    )
    cmd = [sys.executable, "-m", "trainguard.agent.cli", "agent", "--server", ingest.url]
    cmd += ["--token", "test-agent-token", "--node", node, "--simulate", "2", "--interval", "0.2"]
    with log.open("wb") as out:
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
    wait_for(lambda: "started: node" in log.read_text(), timeout=30)
    return log


def test_an_agent_named_otherwise_than_its_host_meets_an_sdk_with_no_settings(
    tmp_path: Path, ingest: Ingest, procs: list[Any]
) -> None:
    node = "my-node"
    assert socket.gethostname() != node
    log = start_agent(tmp_path, ingest, procs, node)
    sock = tmp_path / "run" / "agent.sock"  # the first well-known place, not named after node
    start_line = next(line for line in log.read_text().splitlines() if "started: node" in line)
    for part in (f"node {node}", f"server {ingest.url}", f"socket {sock}", "simulated GPUs x2"):
        assert part in start_line, start_line
    wait_for(lambda: "reached the backend" in log.read_text(), timeout=30)

    env = clean_env(tmp_path, RANK="0", WORLD_SIZE="1")
    rank = subprocess.Popen(
        [sys.executable, RANK, "--steps", "100000", "--detect"],
        env=env,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    procs.append(rank)
    (status, *_) = wait_for(lambda: ingest.ranks(rank.pid), timeout=30)
    assert status.launcher == "none" and status.in_process is False
    # `python rank_script.py`: the job is named after the script and this very process
    assert status.job.startswith("rank_script-") and status.display_name == status.job
    wait_for(lambda: any(r.last_step for r in ingest.ranks(rank.pid)), timeout=30)
    rank.send_signal(signal.SIGTERM)
    rank.wait(timeout=15)
    assert rank.stderr is not None and b"trainguard:" not in rank.stderr.read()


def test_an_sdk_given_a_socket_that_does_not_exist_says_so_once_and_trains(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "agent.sock"
    env = clean_env(tmp_path, TRAINGUARD_AGENT_SOCKET=str(missing), TRAINGUARD_JOB="lonely")
    done = subprocess.run(
        [sys.executable, RANK, "--steps", "60", "--step-s", "0.01", "--heartbeat", "0.05"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.decode().splitlines() if line.startswith("trainguard:")]
    assert len(lines) == 1, done.stderr
    assert str(missing) in lines[0] and "TRAINGUARD_AGENT_SOCKET" in lines[0]
    assert "no such file" in lines[0] and "training goes on" in lines[0]


def test_an_sdk_that_finds_no_agent_says_so_once_and_finds_one_that_starts_later(
    tmp_path: Path, ingest: Ingest, procs: list[Any]
) -> None:
    env = clean_env(tmp_path, TRAINGUARD_JOB="early")
    rank = subprocess.Popen(
        [sys.executable, RANK, "--heartbeat", "0.1"],
        env=env,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    procs.append(rank)
    assert rank.stderr is not None
    first = rank.stderr.readline().decode()
    assert first.startswith("trainguard: no node agent reached"), first
    assert str(tmp_path / "run" / "agent.sock") in first
    start_agent(tmp_path, ingest, procs, "late-node")
    (status, *_) = wait_for(lambda: ingest.ranks(rank.pid), timeout=30)
    assert status.job == "early"
    rank.send_signal(signal.SIGTERM)
    rank.wait(timeout=15)
    assert b"trainguard:" not in rank.stderr.read()  # said once


def test_a_second_agent_does_not_take_the_socket_of_a_live_one(
    tmp_path: Path, ingest: Ingest, procs: list[Any]
) -> None:
    start_agent(tmp_path, ingest, procs, "first")
    env = clean_env(
        tmp_path,
        TRAINGUARD_AGENT_CONFIG=str(tmp_path / "absent.toml"),
        TRAINGUARD_AGENT_SPOOL_DIR=str(tmp_path / "spool-second"),
    )
    cmd = [sys.executable, "-m", "trainguard.agent.cli", "agent"]
    cmd += ["--server", ingest.url, "--token", "t"]
    second = subprocess.run(
        [*cmd, "--node", "second", "--simulate", "1"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert second.returncode != 0
    assert b"another agent listens on" in second.stdout + second.stderr
    assert (tmp_path / "run" / "agent.sock").exists()  # still the first agent's
