"""Browser tests of the dashboard against real processes: `trainguard server` (SQLite in a
temporary directory) and `trainguard agent --simulate`, driven by Debian's chromium through
pytest-playwright."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.frontend.seed import JobSeed
from tests.support import free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
STARTUP_S = 45.0


def _trainguard() -> str:
    beside = Path(sys.executable).with_name("trainguard")
    found = str(beside) if beside.exists() else shutil.which("trainguard")
    if not found:
        pytest.fail("the `trainguard` command is not installed (make venv)")
    return found


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (make chromium)")
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "headless": True}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args: dict[str, Any]) -> dict[str, Any]:
    # A laptop screen.
    return {**browser_context_args, "viewport": {"width": 1440, "height": 900}}


@pytest.fixture
def page(page: Page) -> Page:
    page.set_default_timeout(15_000)
    expect.set_options(timeout=15_000)
    return page


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


@dataclass
class Cluster:
    """A real server (and, when started, real agents) on a loopback port."""

    url: str
    token: str
    data_dir: Path
    procs: list[Proc] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    server_env: dict[str, str] = field(default_factory=dict)

    def api(self, path: str, body: Any = None) -> Any:
        """GET (or POST when body is given) /api/v1/<path> with the admin token."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}/api/v1/{path}",
            data=data,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def start(self, name: str, args: list[str], env: dict[str, str]) -> Proc:
        log = self.data_dir / f"{name}.log"
        if log.exists():  # a restart: keep the earlier run's log beside
            log.rename(log.with_suffix(f".{len(self.procs)}.log"))
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
        full_env.update(env)
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [_trainguard(), *args], env=full_env, stdout=out, stderr=subprocess.STDOUT
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} (exit {p.popen.poll()}):\n{p.tail()}" for p in self.procs)

    def _ready(self, server: Proc) -> bool:
        if server.popen.poll() is not None:
            raise AssertionError(f"trainguard server exited early:\n{self.logs()}")
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def start_server(self) -> Proc:
        """Start `trainguard server` on this cluster's port and wait until it is ready."""
        port = self.url.rsplit(":", 1)[1]
        server = self.start(
            "server",
            ["server", "--host", "127.0.0.1", "--port", port, "--log-level", "warning"],
            {
                "TRAINGUARD_ADMIN_TOKEN": self.token,
                "TRAINGUARD_DATA_DIR": str(self.data_dir),
                **self.server_env,
            },
        )
        self.wait(lambda: self._ready(server), "the server never became ready")
        return server

    def kill_server(self) -> None:
        """End the server abruptly, as a crash or a lost host would."""
        for proc in self.procs:
            if proc.name == "server" and proc.popen.poll() is None:
                proc.popen.kill()
                proc.popen.wait(5)

    def start_agent(self, node: str, gpus: int = 2) -> Proc:
        spool = self.data_dir / f"spool-{node}"
        spool.mkdir()
        env = {
            "TRAINGUARD_AGENT_SPOOL_DIR": str(spool),
            "TRAINGUARD_AGENT_INTERVAL": "0.5",
            # A socket of its own: the well-known one (/run/trainguard as root) is one per
            # host, and a live agent's socket is never taken.
            "TRAINGUARD_AGENT_SOCKET_PATH": str(self.data_dir / f"{node}.sock"),
        }
        proc = self.start(
            f"agent-{node}",
            [
                "agent",
                "--server",
                self.url,
                "--token",
                self.token,
                "--node",
                node,
                "--simulate",
                str(gpus),
            ],
            env,
        )
        self.nodes.append(node)
        return proc

    def node(self, name: str) -> dict[str, Any] | None:
        return next((n for n in self.api("nodes") if n["name"] == name), None)

    def wait(self, cond: Callable[[], Any], what: str, timeout: float = STARTUP_S) -> Any:
        try:
            return wait_for(cond, timeout=timeout, every=0.2)
        except AssertionError as error:
            raise AssertionError(f"{what}: {error}\n{self.logs()}") from None

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


def start_server(data_dir: Path, env: dict[str, str] | None = None) -> Cluster:
    port = free_port()
    cluster = Cluster(
        f"http://127.0.0.1:{port}", secrets.token_urlsafe(24), data_dir, server_env=env or {}
    )
    try:
        cluster.start_server()
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture
def empty_server(tmp_path: Path, page: Page) -> Iterator[Cluster]:
    """A server no agent has reported to."""
    cluster = start_server(tmp_path)
    yield cluster
    # Leave the dashboard first: an open live stream holds up the server's graceful exit.
    page.goto("about:blank")
    cluster.stop()


SIM_NODE = "sim-node-1"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A server with one agent simulating two GPUs on SIM_NODE, sampling every 0.5 s."""
    cluster = start_server(tmp_path_factory.mktemp("cluster"))
    try:
        cluster.start_agent(SIM_NODE, gpus=2)
        cluster.wait(
            lambda: (node := cluster.node(SIM_NODE)) and node["gpu_count"] == 2,
            "the simulated node never reported its two GPUs",
        )
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def signed_in(page: Page, cluster: Cluster) -> Page:
    """The page with the token already in this tab's sessionStorage (as after a login)."""
    page.add_init_script(f"sessionStorage.setItem('trainguard.token', {json.dumps(cluster.token)})")
    return page


@pytest.fixture(scope="session")
def screenshot() -> Callable[[Page, str], Path]:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(page: Page, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


JOB = "llama-test"
JOB_NODES = ["job-node-1", "job-node-2"]
SLOW_RANK = 5


@dataclass
class JobFeed:
    """A training job reported the way agents report one: every second, each of its two
    nodes posts its ranks' status and their newest steps to /api/v1/ingest. No agent runs
    on these nodes, so commands addressed to them wait for the test's own acks."""

    cluster: Cluster
    seed: JobSeed
    step: int
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        for body in self.seed.batches(time.time()):
            self.cluster.api("ingest", body)
        self._thread = threading.Thread(target=self._run, name="job-feed", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                for body in self.seed.batches(time.time(), first_step=self.step, steps=1):
                    self.cluster.api("ingest", body)
                self.step += 1
            except OSError:  # the server is stopping
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(5)

    def ack(self, command: dict[str, Any], phase: str, ts: float) -> None:
        """What the node's agent would post when its executor reaches `phase`."""
        self.cluster.api(
            f"commands/{command['id']}/acks", {"phase": phase, "ts": ts, "node": command["node"]}
        )


@pytest.fixture(scope="module")
def job_feed(cluster: Cluster) -> Iterator[JobFeed]:
    """JOB: 8 ranks on JOB_NODES, under NVRx's Wrapper and ft_launcher, 80 steps of
    history (SLOW_RANK 1.6x slower), then a step a second for as long as the module's
    tests run."""
    seed = JobSeed(
        JOB,
        JOB_NODES,
        ranks_per_node=4,
        steps=80,
        slow_rank=SLOW_RANK,
        in_process=True,
        launcher="ft_launcher",
    )
    feed = JobFeed(cluster, seed, step=80)
    feed.start()
    cluster.wait(lambda: cluster.api(f"jobs/{JOB}")["world_size"] == 8, "the job never reported")
    yield feed
    feed.stop()
