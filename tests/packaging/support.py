"""Helpers for the packaging tests: the checkout's layout in the wheel, fresh virtual
environments, and commands run outside the checkout."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from tests.support import free_port, stop_session, wait_for

ROOT = Path(__file__).resolve().parents[2]
# pyproject.toml's package-dir, most specific folder first.
PACKAGE_DIRS = (
    ("agent/protocol", "trainguard/protocol"),
    ("agent/sdk", "trainguard/sdk"),
    ("agent/client", "trainguard/client"),
    ("agent/worker", "trainguard/worker"),
    ("agent", "trainguard/agent"),
    ("backend", "trainguard/backend"),
    ("migrations", "trainguard/migrations"),
    ("frontend", "trainguard/frontend"),
    ("examples", "trainguard/examples"),
)
# pyproject.toml's `trainguard.commands` entry points: each part's commands.
OPERATOR_COMMANDS = ("restart", "incidents", "incident", "approve", "reject", "cordon", "uncordon")
PARTS_COMMANDS = ("server", "demo", "db", "token", "bench", "policy", *OPERATOR_COMMANDS)
NOT_SHIPPED = ("backend/bench/",)  # benchmarks run from a checkout
SERVER_MODULES = ("fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "psycopg")
# Folders of the checkout that are neither source nor data of the package.
_CHECKOUT_ONLY = {"build", "data", "artifacts"}


def installed_path(rel: str) -> str:
    """Where a checkout file lies in the wheel: agent/sdk/x.py -> trainguard/sdk/x.py."""
    for folder, target in PACKAGE_DIRS:
        if rel.startswith(folder + "/"):
            return target + rel[len(folder) :]
    raise ValueError(f"{rel} is in no package folder")


def shipped_files(root: Path = ROOT) -> Iterator[str]:
    """Every file of the package folders that an install needs (source and data)."""
    for folder in ("agent", "backend", "migrations", "frontend", "examples"):
        for path in sorted((root / folder).rglob("*")):
            rel = path.relative_to(root).as_posix()
            if (
                path.is_file()
                and "__pycache__" not in path.parts
                and path.suffix != ".pyc"
                and not rel.startswith(NOT_SHIPPED)
            ):
                yield rel


def copy_checkout(dest: Path) -> Path:
    """The checkout's files without build output, caches, virtual environments or state,
    so a wheel built from it holds only what is there now (setuptools reuses a build/)."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        top = Path(folder).resolve() == ROOT
        return {
            n
            for n in names
            if (n.startswith(".") and (Path(folder) / n).is_dir())
            or n == "__pycache__"
            or n.endswith(".egg-info")
            or (top and n in _CHECKOUT_ONLY)
        }

    shutil.copytree(ROOT, dest, ignore=ignore)
    return dest


def outside_env(**extra: str) -> dict[str, str]:
    """The environment of a command run from an install: none of this checkout's paths or
    the test run's trainguard settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TRAINGUARD_") and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    }
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def run(
    argv: list[str | Path], cwd: Path, timeout: float, check: bool = True, **env: str
) -> subprocess.CompletedProcess[str]:
    """A command from outside the checkout; on an unexpected failure its output tail."""
    proc = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=outside_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, argv))} exited {proc.returncode}:\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def make_venv(where: Path, requirement: str) -> Path:
    """A fresh virtual environment with `requirement` installed the way `make venv` does
    (pip, whose configuration on this machine resolves from its local index); its bin/."""
    run([sys.executable, "-m", "venv", where], cwd=where.parent, timeout=300)
    run([where / "bin" / "pip", "install", "-q", requirement], cwd=where.parent, timeout=900)
    return where / "bin"


@contextlib.contextmanager
def serve(argv: Sequence[str | Path], cwd: Path, env: dict[str, str], log: Path) -> Iterator[str]:
    """`trainguard server ... --port P` (argv without the port) on a free loopback port,
    ready (GET /readyz 200) before the block runs, stopped after it: its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [*map(str, argv), "--port", str(port)],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(ready, 120, 0.2)
        yield url
    finally:
        stop_session(proc)
