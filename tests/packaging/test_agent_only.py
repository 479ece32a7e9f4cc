"""A GPU node's install, `pip install 'trainguard[agent]'` into a fresh venv: no server
dependency; the server's commands and the benchmarks answer one line and exit 2; the
agent delivers to a real server (started from the dev venv)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.packaging.support import (
    ROOT,
    SERVER_MODULES,
    make_venv,
    outside_env,
    run,
    serve,
)
from tests.support import AUTH, TOKEN, stop_session, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a venv on a 2-core machine


@pytest.fixture(scope="module")
def agent_bin(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("agent-only") / "venv", f"{wheel}[agent]")


def test_an_agent_install_has_no_server_dependency(agent_bin: Path, tmp_path: Path) -> None:
    probe = (
        "import importlib.util, sys; "
        "print(*[m for m in sys.argv[1:] if importlib.util.find_spec(m)])"
    )
    found = run([agent_bin / "python", "-c", probe, *SERVER_MODULES], tmp_path, 60)
    assert found.stdout.strip() == ""
    # The same probe sees the agent's own dependencies: it is not blind.
    found = run([agent_bin / "python", "-c", probe, "httpx", "pynvml", "typer"], tmp_path, 60)
    assert found.stdout.split() == ["httpx", "pynvml", "typer"]


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["server"], "server"),
        (["server", "--port", "8123"], "server"),
        (["token", "list"], "token"),
        (["token", "create", "--role", "agent"], "token"),
        (["db", "upgrade"], "db"),
        (["demo", "--no-job"], "demo"),
    ],
)
def test_a_server_command_names_the_extra_it_needs(
    agent_bin: Path, tmp_path: Path, argv: list[str], command: str
) -> None:
    got = run([agent_bin / "trainguard", *argv], tmp_path, 60, check=False)
    assert got.returncode == 2, got
    assert got.stdout == "" and "Traceback" not in got.stderr
    assert got.stderr.strip().splitlines() == [
        f"trainguard {command} needs the server extra: pip install 'trainguard[server]'"
    ]
    assert not (tmp_path / "data").exists()  # nothing was started or created


def test_bench_says_in_one_line_that_it_runs_from_a_checkout(
    agent_bin: Path, tmp_path: Path
) -> None:
    for argv in (["bench"], ["bench", "ingest", "--nodes", "2"], ["bench", "--help"]):
        got = run([agent_bin / "trainguard", *argv], tmp_path, 60, check=False)
        assert got.returncode == 2, got
        assert got.stdout == "" and "Traceback" not in got.stderr
        [line] = got.stderr.strip().splitlines()
        assert line.startswith("trainguard bench runs from a checkout of the repository"), line
        assert "pip install -e ." in line
    listed = run([agent_bin / "trainguard", "--help"], tmp_path, 60).stdout
    for command in ("agent", "server", "demo", "db", "token", "bench"):
        assert f" {command} " in listed, listed


@pytest.fixture
def dev_server(tmp_path: Path) -> Iterator[str]:
    """`trainguard server` from the dev venv (this checkout) on a free loopback port."""
    with serve(
        [sys.executable, "-m", "trainguard.agent.cli", "server"],
        ROOT,
        outside_env(
            PYTHONPATH=str(ROOT),
            TRAINGUARD_ADMIN_TOKEN=TOKEN,
            TRAINGUARD_DATA_DIR=str(tmp_path / "server"),
        ),
        tmp_path / "server.log",
    ) as url:
        yield url


def test_the_agent_of_an_agent_install_delivers_to_a_server(
    agent_bin: Path, dev_server: str, tmp_path: Path
) -> None:
    log = tmp_path / "agent.log"
    agent = subprocess.Popen(
        [
            *(str(agent_bin / "trainguard"), "agent", "--simulate", "1"),
            *("--server", dev_server, "--token", TOKEN, "--node", "agent-only-1"),
        ],
        cwd=tmp_path,
        env=outside_env(
            TRAINGUARD_AGENT_SPOOL_DIR=str(tmp_path / "spool"),
            TRAINGUARD_AGENT_SOCKET_PATH=str(tmp_path / "agent.sock"),
        ),
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        start_new_session=True,
    )

    def listed() -> list[str]:
        assert agent.poll() is None, log.read_text()[-3000:]
        nodes = httpx.get(f"{dev_server}/api/v1/nodes", headers=AUTH, timeout=5).json()
        return [n["name"] for n in nodes]

    try:
        assert wait_for(listed, 90, 0.3) == ["agent-only-1"]
    finally:
        stop_session(agent)
    assert agent.returncode == 0, log.read_text()[-3000:]
