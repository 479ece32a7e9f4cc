#!/usr/bin/env python3
"""Make a checkout importable as `trainguard` without installing it (deploy/gpu-check.sh).

`python3 deploy/gpu-check-tree.py DEST` builds, from pyproject.toml (standard library only):

- DEST/trainguard/<part>: a symbolic link per `[tool.setuptools.package-dir]` entry
  (trainguard.agent -> agent/, trainguard.sdk -> agent/sdk/, ...), so `trainguard` is a
  namespace package over the checkout's folders, backend/bench included (the wheel leaves
  it out);
- DEST/trainguard-<version>.dist-info/: METADATA and entry_points.txt, so the `trainguard`
  CLI (`python -m trainguard.agent.cli`) finds its parts' commands (`server`, `bench`, ...)
  and `importlib.metadata.version("trainguard")` answers.

Then `PYTHONPATH=DEST:$PYTHONPATH python -m trainguard.agent.cli server` runs the checkout's
code. DEST is replaced. (.ci/namespace, the committed tree the type checkers read, links
agent/ module by module instead, so agent/sdk/ is not also trainguard.agent.sdk.)
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(dest: Path, root: Path = ROOT) -> Path:
    project = tomllib.loads((root / "pyproject.toml").read_text())
    meta, setuptools = project["project"], project["tool"]["setuptools"]
    shutil.rmtree(dest, ignore_errors=True)
    pkg = dest / "trainguard"
    pkg.mkdir(parents=True)
    for name, src in setuptools["package-dir"].items():
        parts = name.split(".")
        if parts[0] != "trainguard" or len(parts) != 2:
            raise SystemExit(f"gpu-check-tree: unexpected package-dir entry {name}")
        (pkg / parts[1]).symlink_to(root / src, target_is_directory=True)
    info = dest / f"trainguard-{meta['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n"
    )
    groups = {"console_scripts": meta.get("scripts", {}), **meta.get("entry-points", {})}
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
            for group, eps in groups.items()
        )
    )
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: gpu-check-tree.py DEST")
    build(Path(sys.argv[1]).resolve())
