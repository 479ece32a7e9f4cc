"""deploy/gpu-check.sh and `trainguard bench gpu` (backend/bench/gpucheck.py) on this
machine's CPUs: the checkout made importable without an install, the one-line skips, and
(slow) two cells end to end in `--cpu` mode (gloo, a real server, a real simulated agent,
torchrun restarting the job after an exception and after a SIGKILL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from trainguard.backend.bench import gpucheck

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "gpu-check.sh"


def test_the_tree_makes_the_checkout_importable_with_its_commands(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "gpu-check-tree.py"), str(tree)], check=True
    )
    # -S: no site-packages processing, so no editable install; the dependencies come from
    # PYTHONPATH, trainguard from the tree only
    code = (
        "import json, os, trainguard.backend.bench.gpucheck as g; "
        "from importlib.metadata import entry_points, version; "
        "print(os.path.realpath(g.__file__)); print(version('trainguard')); "
        "print(json.dumps([e.name for e in entry_points(group='trainguard.commands')]))"
    )
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{sysconfig.get_paths()['purelib']}"}
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0] == str(ROOT / "backend" / "bench" / "gpucheck.py")
    assert out[1] == "0.1.0"
    assert {"server", "bench"} <= set(json.loads(out[2]))


def test_a_missing_piece_is_one_line_per_cell() -> None:
    no_cuda = gpucheck.Probe(torch="2.11.0", cuda=False, nvrx="0.7.0")
    assert "no CUDA device" in (gpucheck.why_not("torchrun-cold", no_cuda, cpu=False) or "")
    assert gpucheck.why_not("torchrun-cold", no_cuda, cpu=True) is None
    no_nvrx = gpucheck.Probe(torch="2.11.0", nvrx_error="ModuleNotFoundError: x")
    assert "no NVRx" in (gpucheck.why_not("ft_launcher-warm", no_nvrx, cpu=True) or "")
    no_torch = gpucheck.Probe(torch_error="ModuleNotFoundError: No module named 'torch'")
    assert "torch does not import" in (gpucheck.why_not("torchrun-cold", no_torch, cpu=True) or "")
    row = gpucheck.Row("ft_launcher-cold", "sigkill", "ft_launcher", True, "cold", note="no NVRx")
    result = {
        "mode": "gpu",
        "probe": {"python": "3.12", "torch": None, "devices": [], "nccl": None, "nvrx": None},
        "nproc": 1,
        "rows": [row.__dict__],
    }
    line = gpucheck.table(result).splitlines()[2]
    assert line.startswith("| ft_launcher | yes | cold | sigkill | - | - | - | skipped: no NVRx |")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_check_in_cpu_mode_prints_numeric_recoveries(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [
            str(SCRIPT),
            *("--cpu", "--jobs", "torchrun-cold", "--faults", "exception,sigkill"),
            *("--json", str(out), "--workdir", str(tmp_path / "work")),
        ],
        env={**os.environ, "PYTHON": sys.executable, "GPU_CHECK_TIMEOUT": "200"},
        capture_output=True,
        text=True,
        timeout=230,
    )
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    rows = {r["fault"]: r for r in res["rows"]}
    assert set(rows) == {"exception", "sigkill"}
    for r in rows.values():
        assert r["status"] == "ok" and r["level"] == "launcher", r
        assert 0 < r["recovery_s"] < 120 and 0 < r["script_s"] < 120, r
    assert rows["sigkill"]["cause"] in ("rank_exit", "exception")
    table = [ln for ln in proc.stdout.splitlines() if ln.startswith("| torchrun | no | cold |")]
    assert len(table) == 2
    rd = res["readings"]
    assert rd["count"] == 2 and rd["simulated"] == [True] and rd["samples"] > 0
    assert rd["ranges"]["util"] is not None
    assert "simulated: true" in proc.stdout
