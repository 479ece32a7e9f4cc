"""NVRx 0.4 pulls in the deprecated `pynvml` distribution, which prints a FutureWarning at
the first import of a `pynvml` module in a process (torch imports it, NVRx too). Where
trainguard imports them (the NVML collector, the agent-hosted store, the worker pool, the
worker shim's cold run), nothing of it reaches stderr, even with -W default."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import free_port, wait_for

PY = sys.executable
WARNING = "pynvml package is deprecated"


def _stderr(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    r = subprocess.run(
        [PY, "-W", "default", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=cwd,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stderr


@pytest.fixture(scope="module", autouse=True)
def _the_warning_is_there() -> None:
    """Without the deprecated distribution there is nothing to keep quiet."""
    if WARNING not in _stderr("-c", "import torch"):
        pytest.skip("the deprecated pynvml distribution is not installed here")


@pytest.mark.parametrize(
    "code",
    [
        "from trainguard.agent.collectors import nvml; nvml._import_pynvml()",
        "from trainguard.agent.executors import storehost; storehost._torch_distributed()",
        "from trainguard.agent.executors import storehost; storehost._make_agent_store()",
    ],
    ids=["nvml", "store-client", "wrapper-store"],
)
def test_trainguards_imports_of_pynvml_print_no_warning(code: str) -> None:
    pytest.importorskip("nvidia_resiliency_ext")
    assert WARNING not in _stderr("-c", code)


def test_a_cold_worker_prints_no_warning(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("import torch\nprint('trained')\n"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env["TRAINGUARD_WORKER_POOL"] = "off"
    err = _stderr("-m", "trainguard.worker", str(script), env=env, cwd=tmp_path)
    assert WARNING not in err


@pytest.mark.slow
def test_the_agent_and_its_warm_pool_print_no_warning(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env.update(
        TRAINGUARD_AGENT_SPOOL_DIR=str(tmp_path / "spool"),
        TRAINGUARD_AGENT_SOCKET_PATH=str(tmp_path / "agent.sock"),
        PYTHONWARNINGS="default",
    )
    with log.open("wb") as out:
        agent = subprocess.Popen(
            [
                *(PY, "-m", "trainguard.agent.cli", "agent"),
                *("--server", f"http://127.0.0.1:{free_port()}", "--token", "t"),
                *("--node", "quiet-node", "--simulate", "1", "--pool", "1"),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "warm interpreters" in log.read_text(), 120, 0.2)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
    assert WARNING not in log.read_text(), log.read_text()[-3000:]
