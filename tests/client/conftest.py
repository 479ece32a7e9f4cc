"""The operator CLI against real `trainguard server` processes (SQLite in a temporary
directory) on free loopback ports, with jobs reported through the ingest API the way
agents report them; each command runs as its own `trainguard` process."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.frontend.seed import JobSeed
from tests.packaging.support import ROOT, outside_env, serve
from tests.support import AUTH, TOKEN, wait_for

TRAINGUARD = Path(sys.executable).with_name("trainguard")


@dataclass
class Server:
    url: str

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """/api/v1/<path> with the admin token, straight over HTTP (not the client)."""
        r = httpx.request(method, f"{self.url}/api/v1/{path}", json=body, headers=AUTH, timeout=10)
        r.raise_for_status()
        return r.json()

    def feed(self, seed: JobSeed) -> None:
        """The job's ranks report (status and steps), as their nodes' agents would."""
        for body in seed.batches(time.time()):
            self.api("POST", "ingest", body)
        wait_for(lambda: self.api("GET", f"jobs/{seed.name}")["world_size"] == seed.world_size)

    def cli(
        self, *argv: str, token: str | None = TOKEN, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """`trainguard ARGV` pointed at this server through the environment."""
        settings = {"TRAINGUARD_SERVER": self.url, **({"TRAINGUARD_TOKEN": token} if token else {})}
        return subprocess.run(
            [str(TRAINGUARD), *argv],
            cwd=ROOT,
            env=outside_env(**settings, **env),
            capture_output=True,
            text=True,
            timeout=60,
        )


def _server(tmp: Path, **env: str) -> Iterator[Server]:
    with serve(
        [TRAINGUARD, "server", "--host", "127.0.0.1", "--log-level", "warning"],
        ROOT,
        outside_env(TRAINGUARD_ADMIN_TOKEN=TOKEN, TRAINGUARD_DATA_DIR=str(tmp), **env),
        tmp / "server.log",
    ) as url:
        yield Server(url)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _server(tmp_path_factory.mktemp("server"))


@pytest.fixture(scope="module")
def dry_run_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server whose decision engine only recommends (policy mode dry_run)."""
    tmp = tmp_path_factory.mktemp("dry-run")
    policy = tmp / "policy.toml"
    policy.write_text('mode = "dry_run"\n')
    yield from _server(tmp, TRAINGUARD_POLICY_FILE=str(policy))
