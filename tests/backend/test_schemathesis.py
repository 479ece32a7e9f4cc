"""schemathesis over the live API: every check, all four phases (examples, coverage,
fuzzing, stateful), against a real `trainguard server` (SQLite through the real
migrations) on a free loopback port, with an operator token for the API and an
agent-role token for the agents' routes (docs/api-contract.md, "Contract run"). Every
check is on through tests/backend/schemathesis.toml (`[checks] enabled = true`, the same
as `--checks all`), which also names each exception and its reason."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.frontend.seed import JobSeed
from tests.packaging.support import ROOT, outside_env, serve
from tests.support import AUTH, TOKEN, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

BIN = Path(sys.executable).parent
CONFIG = Path(__file__).with_name("schemathesis.toml")
# The long-poll's cap for this run (TRAINGUARD_COMMAND_WAIT_MAX_S): each poll that finds
# nothing holds its request this long, and the request timeout stays well above it.
WAIT_CAP_S = 0.1
REQUEST_TIMEOUT_S = 10.0


def _operator_token(env: dict[str, str]) -> str:
    got = subprocess.run(
        [str(BIN / "trainguard"), "token", "create", "--role", "operator", "--name", "st"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return got.stdout.strip()


def _seed(url: str) -> None:
    """What the config's dictionaries name: node `st-node` with two GPUs (GPU 1 fell off
    the bus: its sample has no reading) and job `st-job` of four ranks on it."""
    now = time.time()
    node = {
        "v": 1,
        "node": "st-node",
        "agent_id": "st-inventory",
        "seq": 1,
        "sent_at": now,
        "simulated": True,
        "gpus": [{"uuid": f"GPU-st-node-{i}", "index": i, "name": "sim"} for i in range(2)],
        "samples": [
            {"uuid": "GPU-st-node-0", "ts": now, "util": 90.0, "temp_c": 60.0},
            {"uuid": "GPU-st-node-1", "ts": now},
        ],
    }
    job = JobSeed("st-job", ["st-node"], ranks_per_node=4, steps=20)
    for body in [node, *job.batches(now)]:
        httpx.post(f"{url}/api/v1/ingest", json=body, headers=AUTH, timeout=10).raise_for_status()

    def seeded() -> bool:
        r = httpx.get(f"{url}/api/v1/jobs/st-job", headers=AUTH, timeout=10)
        return r.status_code == 200 and r.json()["world_size"] == job.world_size

    wait_for(seeded)


def test_schemathesis_finds_no_failure_in_any_check_or_phase(tmp_path: Path) -> None:
    env = outside_env(
        TRAINGUARD_ADMIN_TOKEN=TOKEN,
        TRAINGUARD_DATA_DIR=str(tmp_path),
        # Operator actions are rate-limited per principal (30, then 30 a minute): the run
        # fires thousands, so the bucket is made large enough never to empty.
        TRAINGUARD_OPERATOR_RATE_BURST="1000000",
        TRAINGUARD_COMMAND_WAIT_MAX_S=str(WAIT_CAP_S),
    )
    argv = [BIN / "trainguard", "server", "--host", "127.0.0.1", "--log-level", "warning"]
    with serve(argv, ROOT, env, tmp_path / "server.log") as url:
        _seed(url)
        operator = _operator_token(env)
        assert operator.startswith("tg_")
        started = time.monotonic()
        run = subprocess.run(
            [
                str(BIN / "schemathesis"),
                "--config-file",
                str(CONFIG),
                "--no-color",
                "run",
                f"{url}/openapi.json",
                "--phases",
                "examples,coverage,fuzzing,stateful",
                "--max-examples",
                "100",
                # One worker: CPython 3.11's AST constructor is not thread-safe, and
                # hypothesis parses source while describing strategies (a flaky
                # "AST constructor recursion depth mismatch" with two).
                "--workers",
                "1",
                "--seed",
                "1",
                "--request-timeout",
                str(REQUEST_TIMEOUT_S),
                "--report",
                "junit",
                "--report-dir",
                str(tmp_path / "report"),
            ],
            cwd=tmp_path,
            env={**os.environ, "TG_OPERATOR_TOKEN": operator, "TG_AGENT_TOKEN": TOKEN},
            capture_output=True,
            text=True,
            timeout=540,
        )
        took = time.monotonic() - started
    out = run.stdout + run.stderr
    assert run.returncode == 0, (
        f"schemathesis exited {run.returncode} after {took:.0f} s:\n{out[-12000:]}"
    )
    # The run reached the API: every operation was tested, none only refused for its token.
    selected = re.search(r"Selected: (\d+)/(\d+)", out)
    tested = re.search(r"Tested: (\d+)", out)
    assert selected and tested, out[-3000:]
    assert int(tested[1]) == int(selected[2]) >= 30, out[-3000:]
    assert "Authentication failed" not in out, out[-3000:]
