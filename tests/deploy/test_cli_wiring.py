"""The deploy options end to end through the real CLI: `trainguard server --log-format
json` and `trainguard agent --simulate 2 --metrics-port P` as real processes, the agent
delivering to the server and serving dcgm-exporter-named metrics. The options are in
backend/cli.py (server) and agent/cli.py (agent), both reached through the one root
command (docs/deploy.md, "CLI wiring"); where one is missing, these tests skip and say
why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from tests.support import TOKEN, free_port, stop_session, wait_for
from trainguard.agent.cli import app

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parents[2]


def _has_option(command: str, option: str) -> bool:
    return option in CliRunner().invoke(app, [command, "--help"]).output


def _start(args: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "trainguard.agent.cli", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TRAINGUARD_ADMIN_TOKEN": TOKEN, **env},
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        start_new_session=True,
    )


@pytest.fixture
def json_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    if not _has_option("server", "--log-format"):
        pytest.skip("`trainguard server` has no --log-format yet (docs/deploy.md, CLI wiring)")
    port = free_port()
    log = tmp_path / "server.log"
    p = _start(
        ["server", "--port", str(port), "--log-format", "json"],
        log,
        TRAINGUARD_DATA_DIR=str(tmp_path / "data"),
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert p.poll() is None, log.read_text()[-2000:]
        try:
            return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(ready, 60, 0.1)
        yield url, log
    finally:
        stop_session(p)


def test_server_logs_json_and_the_agent_serves_metrics(
    json_server: tuple[str, Path], tmp_path: Path
) -> None:
    if not _has_option("agent", "--metrics-port"):
        pytest.skip("`trainguard agent` has no --metrics-port yet (docs/deploy.md, CLI wiring)")
    url, server_log = json_server
    mport = free_port()
    log = tmp_path / "agent.log"
    agent = _start(
        [
            *("agent", "--server", url, "--token", TOKEN, "--node", "n1", "--simulate", "2"),
            *("--interval", "0.2", "--metrics-port", str(mport)),
        ],
        log,
        TRAINGUARD_AGENT_SPOOL_DIR=str(tmp_path / "spool"),
        TRAINGUARD_AGENT_SOCKET_PATH=str(tmp_path / "a.sock"),
        TRAINGUARD_AGENT_METRICS_HOST="127.0.0.1",
    )
    try:

        def scraped() -> str | None:
            assert agent.poll() is None, log.read_text()[-2000:]
            try:
                text = httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=1).text
            except httpx.TransportError:
                return None
            sent = "trainguard_agent_uplink_batches_sent_total" in text
            return text if "DCGM_FI_DEV_GPU_UTIL{" in text and sent else None

        text = wait_for(scraped, 60, 0.2)
        assert 'UUID="GPU-sim-n1-0"' in text and 'Hostname="n1"' in text
        nodes = httpx.get(f"{url}/api/v1/nodes", headers={"Authorization": f"Bearer {TOKEN}"})
        assert [n["name"] for n in nodes.json()] == ["n1"]
    finally:
        stop_session(agent)
    records = [json.loads(line) for line in server_log.read_text().splitlines() if line.strip()]
    assert any(r["logger"] == "uvicorn.access" and r["path"] == "/api/v1/ingest" for r in records)
