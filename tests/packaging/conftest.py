"""The wheel, built once per test session from a clean copy of the checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.packaging.support import copy_checkout


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = copy_checkout(tmp / "src")
    dist = tmp / "dist"
    # The dev venv's pip and setuptools, offline: --no-build-isolation.
    pip = Path(sys.executable).with_name("pip")
    argv = [pip, "wheel", "-q", "--no-deps", "--no-build-isolation", src, "-w", dist]
    built = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=600, check=False
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [whl] = dist.glob("trainguard-*.whl")
    return whl


@pytest.fixture(scope="session")
def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())
