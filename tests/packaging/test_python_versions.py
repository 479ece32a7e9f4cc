"""`pip install 'trainguard[train]'` on every current Python (3.11 to 3.13), and what the
demo runs where NVRx has no wheel (docs/restarts.md, "NVRx versions")."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from trainguard.backend import demo

ROOT = Path(__file__).resolve().parents[2]


def train_extra(python: str) -> dict[str, Requirement]:
    """The train extra's requirements that apply on Python `python` (X.Y), by name."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = {**default_environment(), "python_version": python, "python_full_version": python}
    reqs = (Requirement(line) for line in extras["optional-dependencies"]["train"])
    return {r.name: r for r in reqs if r.marker is None or r.marker.evaluate(env)}


@pytest.mark.parametrize("python", ["3.11", "3.12"])
def test_the_train_extra_brings_nvrx_where_a_wheel_exists(python: str) -> None:
    assert {"torch", "nvidia-resiliency-ext"} <= set(train_extra(python))


@pytest.mark.parametrize("python", ["3.13", "3.14"])
def test_the_train_extra_leaves_nvrx_out_where_no_wheel_exists(python: str) -> None:
    extra = train_extra(python)
    assert "nvidia-resiliency-ext" not in extra
    assert "torch" in extra


def test_without_nvrx_the_demo_runs_torchrun_and_says_why(monkeypatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name.split(".")[0] == "nvidia_resiliency_ext" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    launcher, why = demo.job_launcher((3, 13))
    assert launcher == "torchrun"
    assert "no wheel for Python 3.13" in why and "no in-process Wrapper" in why
    launcher, why = demo.job_launcher((3, 11))
    assert launcher == "torchrun" and "not installed" in why


def test_with_nvrx_the_demo_runs_ft_launcher() -> None:
    if importlib.util.find_spec("nvidia_resiliency_ext") is None:
        pytest.skip("NVRx is not installed in this environment")
    assert demo.job_launcher() == ("ft_launcher", "")


def python_3_13() -> str | None:
    """A Python 3.13 interpreter: on PATH, else one of pyenv's (its shim answers only for
    the selected version)."""
    for candidate in [
        shutil.which("python3.13"),
        *map(str, sorted(Path.home().glob(".pyenv/versions/3.13*/bin/python3.13"))),
    ]:
        if candidate and subprocess.run([candidate, "-V"], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_pip_resolves_the_train_extra_on_python_3_13(tmp_path: Path) -> None:
    """A real resolve (`pip install --dry-run`) by a Python 3.13 interpreter against the
    package index: it fails when the extra requires NVRx there."""
    py313 = python_3_13()
    if py313 is None:
        pytest.skip("no Python 3.13 on this machine")
    report = tmp_path / "report.json"
    out = subprocess.run(
        [py313, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), f"{ROOT}[train]"],
        capture_output=True, text=True, timeout=540, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    names = {i["metadata"]["name"].lower() for i in json.loads(report.read_text())["install"]}
    assert {"trainguard", "torch"} <= names
    assert "nvidia-resiliency-ext" not in names
