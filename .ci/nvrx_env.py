#!/usr/bin/env python3
"""Build a second environment with another NVRx line, from PyPI files only.

pip on this machine (glibc 2.36) resolves nvidia-resiliency-ext 0.4.1; 0.6.0 and 0.7.0,
what current GPU machines install, are manylinux_2_39 wheels that pip will not install
here. 0.7.0 is pure Python but for `nvrx_cupti_module` (the CUDA straggler module's
CUPTI binding, cp312), so its files run on any Python 3.10+. This script:

1. installs into the venv it runs in torch from `--torch` (the CPU wheel on disk) and
   trainguard's `dev` extra, editable, plus numpy, but not the `train` extra (whose NVRx
   would be 0.4.1);
2. downloads the NVRx wheel for the platform it was built for (`pip download
   --only-binary=:all: --platform manylinux_2_39_x86_64 --python-version X`);
3. installs the requirements its METADATA lists (extras and torch left out) with pip;
4. installs the wheel's files, console scripts included, with PyPA's `installer`, which
   does not check the wheel's platform tag.

Usage: VENV/bin/python .ci/nvrx_env.py VERSION [--wheel-python 3.12] [--torch SPEC], in a
venv that has `packaging` and `installer` (`make venv-nvrx07` makes it and runs this;
`make test` runs the restart tests in it).
"""

from __future__ import annotations

import argparse
import email.parser
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PLATFORM = "manylinux_2_39_x86_64"


def run(*cmd: str | Path) -> None:
    subprocess.run([str(c) for c in cmd], check=True)


def requirements(wheel: Path) -> list[str]:
    """What the wheel's METADATA requires on this interpreter, its extras left out, and
    torch left out too (the venv has the CPU build; pip must not swap in a CUDA one)."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(zf.read(name).decode())
    out = []
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.name == "torch" or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        req.marker = None
        out.append(str(req))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("version")
    ap.add_argument("--wheel-python", default="3.12", help="the wheel's Python tag (X.Y)")
    ap.add_argument("--torch", default="torch==2.13.0")
    args = ap.parse_args()
    py = Path(sys.executable)
    pip = [py, "-m", "pip"]
    run(*pip, "install", "-q", args.torch)
    run(*pip, "install", "-q", "-e", f"{ROOT}[dev]", "numpy>=1.26")
    with tempfile.TemporaryDirectory() as tmp:
        run(
            *pip, "download", "-q", "--no-deps", "--only-binary=:all:",
            "--python-version", args.wheel_python, "--platform", PLATFORM,
            "-d", tmp, f"nvidia-resiliency-ext=={args.version}",
        )  # fmt: skip
        (wheel,) = Path(tmp).glob("nvidia_resiliency_ext-*.whl")
        run(*pip, "install", "-q", *requirements(wheel))
        run(*pip, "uninstall", "-q", "-y", "nvidia-resiliency-ext")  # a rerun replaces it
        run(py, "-m", "installer", wheel)
    check = (
        "import importlib.metadata as m, nvidia_resiliency_ext.inprocess, "
        "nvidia_resiliency_ext.fault_tolerance.launcher; "
        "print('nvidia-resiliency-ext', m.version('nvidia-resiliency-ext'), 'in', "
        f"{sys.prefix!r})"
    )
    run(py, "-c", check)
    return 0


if __name__ == "__main__":
    sys.exit(main())
