"""`trainguard demo`, the README's first command: backend + simulated agents + the real
training job, all reachable over HTTP, stopped cleanly by Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support import free_port, wait_for

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("launcher", ["default", "torchrun"])
def test_demo_runs_nodes_and_the_training_job_until_ctrl_c(tmp_path: Path, launcher: str) -> None:
    """The default is ft_launcher with NVRx's Wrapper (NVRx's simulation switch said in the
    banner); `--launcher torchrun` is what a machine without NVRx (Python 3.13) runs."""
    port = free_port()
    log = tmp_path / "demo.out"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainguard.agent.cli",
                "demo",
                "--port",
                str(port),
                "--data-dir",
                str(tmp_path / "demo"),
                *(["--launcher", launcher] if launcher != "default" else []),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        token = wait_for(lambda: re.search(r"token: (\S+)\)", log.read_text()), 90).group(1)
        api = httpx.Client(
            base_url=f"http://127.0.0.1:{port}/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=5,
        )

        def nodes_with_gpus() -> list[dict]:
            nodes = [n for n in api.get("/nodes").json() if n["gpu_count"] == 2]
            return nodes if len(nodes) == 3 else []

        nodes = wait_for(nodes_with_gpus, 60)  # the three agents' first batches
        assert {n["name"] for n in nodes} == {"demo-node-0", "demo-node-1", "demo-node-2"}
        assert all(n["simulated"] for n in nodes)
        # The real torch.distributed job reports steps from all 4 ranks.
        job = wait_for(
            lambda: [j for j in api.get("/jobs").json() if (j["last_step"] or 0) >= 20], 180
        )[0]
        assert job["name"] == "demo-1" and job["world_size"] == 4
        ranks = api.get(f"/jobs/{job['name']}").json()["ranks"]
        assert {r["rank"] for r in ranks} == {0, 1, 2, 3}
        # Two nodes train; the third's launcher waits as the hot spare.
        assert len({r["node"] for r in ranks}) == 2, ranks
        banner = log.read_text()
        assert "waits as a hot spare" in banner
        # The job's shape: the spare's agent lists its waiting launcher. Which launcher
        # waits is the rendezvous's choice (ft_launcher's is not always the last started):
        # the node without ranks.
        training = {r["node"] for r in ranks}
        (idle,) = {n["name"] for n in nodes} - training
        shape = wait_for(
            lambda: (s := api.get(f"/jobs/{job['name']}").json()["shape"])["spares"] and s, 60
        )
        assert [(x["node"], x["available"]) for x in shape["spares"]] == [(idle, True)], shape
        assert shape["active"] == sorted(training), shape
        assert (shape["min_nodes"], shape["max_nodes"]) == (2, 2)
        if launcher == "torchrun":
            assert "3 torchruns x 2 ranks" in banner
            assert {(r["launcher"], r["in_process"]) for r in ranks} == {("torchrun", False)}
        else:
            assert "NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE=1" in banner
            assert {(r["launcher"], r["in_process"]) for r in ranks} == {("ft_launcher", True)}
        assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 200  # the dashboard
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(60)
    assert rc == 0, log.read_text()[-2000:]
    assert "Traceback" not in log.read_text()
