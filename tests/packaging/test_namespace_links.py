"""The committed link tree .ci/namespace/trainguard/ (docs/decisions.md, "Tools see the
house"): mypy, pyright and import-linter read the installed namespace through it, so it
must be pyproject.toml's package-dir, no more, no less, stored by git as links."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import shutil
import subprocess
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
RELINK = "run `.ci/typecheck --relink` and commit .ci/namespace"


def _typecheck() -> ModuleType:
    path = ROOT / ".ci" / "typecheck"
    loader = importlib.machinery.SourceFileLoader("typecheck", str(path))
    spec = importlib.util.spec_from_loader("typecheck", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


typecheck = _typecheck()


def test_the_committed_links_are_pyprojects_package_dir() -> None:
    drift = typecheck.drift(ROOT)
    assert not drift, f"{RELINK}:\n" + "\n".join(drift)


def test_git_stores_every_link_as_a_link() -> None:
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "-s", "--", ".ci/namespace"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    modes = {line.split("\t")[1].removeprefix(".ci/namespace/"): line.split()[0] for line in listed}
    want = typecheck.expected_links(ROOT)
    assert set(modes) == set(want), f"{RELINK} (git add it)"
    assert set(modes.values()) == {"120000"}, modes


def test_the_tools_are_pointed_at_the_links() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    assert tool["mypy"]["mypy_path"] == "$MYPY_CONFIG_FILE_DIR/.ci/namespace"
    assert tool["mypy"]["packages"] == ["trainguard"]
    assert tool["pyright"]["extraPaths"] == [".ci/namespace"]
    assert tool["importlinter"]["root_package"] == "trainguard"


def _checkout(root: Path) -> Path:
    """A checkout in miniature: a folder holding another package's folder, and two plain."""
    (root / "pyproject.toml").write_text(
        "[tool.setuptools.package-dir]\n"
        '"trainguard.agent" = "agent"\n'
        '"trainguard.sdk" = "agent/sdk"\n'
        '"trainguard.backend" = "backend"\n'
    )
    for rel in ("agent/__init__.py", "agent/cli.py", "agent/uplink/__init__.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).touch()
    for rel in ("agent/sdk/__init__.py", "backend/__init__.py", "backend/bench/run.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).touch()
    (root / "agent" / "README.md").touch()
    (root / "agent" / "__pycache__").mkdir()
    return root


def test_a_nested_package_gets_one_name_and_plain_folders_one_link(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    assert typecheck.expected_links(root) == {
        "trainguard/agent/__init__.py": "../../../../agent/__init__.py",
        "trainguard/agent/cli.py": "../../../../agent/cli.py",
        "trainguard/agent/uplink": "../../../../agent/uplink",
        "trainguard/sdk": "../../../agent/sdk",
        "trainguard/backend": "../../../backend",
    }
    typecheck.relink(root)
    assert typecheck.drift(root) == []
    tree = root / ".ci" / "namespace" / "trainguard"
    assert (tree / "backend" / "bench" / "run.py").resolve() == root / "backend/bench/run.py"
    assert not (tree / "agent" / "sdk").exists()


def test_a_new_module_a_removed_one_and_a_copied_file_are_drift(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    typecheck.relink(root)
    (root / "backend" / "new.py").touch()  # inside a linked folder: no change
    tree = root / ".ci" / "namespace" / "trainguard"
    for cache in (tree / "agent" / "__pycache__", tree.parent / ".grimp_cache"):
        cache.mkdir()
        (cache / "cached").touch()  # bytecode of an import through the tree, a tool's cache
    assert typecheck.drift(root) == []
    (root / "agent" / "daemon.py").touch()
    (root / "agent" / "cli.py").unlink()
    (tree / "sdk").unlink()
    (tree / "sdk").write_text("../../../agent/sdk")  # a checkout without symlinks
    assert typecheck.drift(root) == [
        "stale: .ci/namespace/trainguard/agent/cli.py -> ../../../../agent/cli.py",
        "missing: .ci/namespace/trainguard/agent/daemon.py -> ../../../../agent/daemon.py",
        "not a link: .ci/namespace/trainguard/sdk",
    ]
    typecheck.relink(root)
    assert typecheck.drift(root) == []
