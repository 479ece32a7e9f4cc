#!/usr/bin/env bash
# Download the wheels deploy/gpu-check.sh needs on a GPU machine that has Python 3.12 and
# torch but no index: trainguard's server and agent dependencies and NVRx 0.7.0, for
# CPython 3.12 on x86_64 Linux, into .whl/ (not committed: .gitignore).
#
#   deploy/gpu-check-wheels.sh [DEST]        # where an index is reachable; DEST=.whl
#   # copy the checkout with .whl/ to the GPU machine, then there:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site deploy/gpu-check.sh  # (or let gpu-check.sh do the install)
#
# The list is resolved from the wheels themselves: starting from SEEDS, every downloaded
# wheel's METADATA Requires-Dist (no extras; markers evaluated for CPython 3.12 on Linux
# x86_64) adds what is missing, until nothing is. Left out: torch (on the machine already,
# and everything only torch needs) and uvicorn's `[standard]` extras that NVRx asks for
# (uvloop, httptools, watchfiles, websockets: optional speed-ups; uvicorn runs without).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:-$REPO/.whl}
PYTHON=${PYTHON:-python3}
mkdir -p "$DEST"
exec "$PYTHON" - "$DEST" <<'EOF'
import subprocess, sys, zipfile
from pathlib import Path

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # pip vendors it
    from pip._vendor.packaging.markers import Marker
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

dest = Path(sys.argv[1])
# The versions trainguard's CI resolves (pyproject.toml's agent, server and base deps),
# then NVRx 0.7.0 (manylinux_2_39, Python 3.12).
SEEDS = [
    "fastapi==0.165.0", "starlette==1.10.0", "pydantic==2.14.4", "pydantic-core==2.50.5",
    "pydantic-settings==2.16.3", "sqlalchemy==2.1.9", "alembic==1.20.1", "uvicorn==0.55.0",
    "httpx==0.29.0", "httpcore==1.0.9", "anyio==4.16.0", "h11==0.16.0", "sniffio",
    "idna==3.21", "certifi==2026.10.19.post1", "typer==0.29.2", "click==8.5.1",
    "rich==15.0.0", "msgspec==0.23.0", "nvidia-ml-py==13.615.71", "prometheus-client==0.26.0",
    "pyyaml==6.0.4", "mako==1.4.3", "markupsafe==3.0.4", "typing-extensions==4.16.0",
    "typing-inspection==0.4.5", "annotated-types==0.8.0", "greenlet==3.5.6",
    "shellingham==1.5.4", "markdown-it-py==4.3.0", "mdurl==0.1.2", "pygments==2.21.0",
    "python-dotenv==1.2.4", "nvidia-resiliency-ext==0.7.0",
]
SKIP = {"torch"}  # on the GPU machine already
ENV = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "extra": ""}
# glibc 2.28 and older tags (pip does not widen an explicit --platform); NVRx 0.7.0 is
# built for glibc 2.39 only.
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (28, 27, 24, 17)] + ["manylinux2014_x86_64"]
PLATFORM = {"nvidia-resiliency-ext": ["manylinux_2_39_x86_64"]}


def have() -> dict[str, Path]:
    return {canonicalize_name(w.name.split("-")[0]): w for w in dest.glob("*.whl")}


def download(spec: str) -> None:
    name = canonicalize_name(Requirement(spec).name)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
           *(f"--platform={p}" for p in PLATFORM.get(name, PLATFORMS)), "-d", str(dest), spec]
    subprocess.run(cmd, check=True)


def requires(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    out = []
    for line in lines:
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or Marker(str(req.marker)).evaluate(ENV):
                out.append(req)
    return out


for spec in SEEDS:
    if canonicalize_name(Requirement(spec).name) not in have():
        download(spec)
while True:
    wheels = have()
    missing = {}
    for wheel in wheels.values():
        for req in requires(wheel):
            name = canonicalize_name(req.name)
            if name not in wheels and name not in SKIP:
                missing[name] = f"{req.name}{req.specifier}"
    if not missing:
        break
    for name, spec in sorted(missing.items()):
        print(f"gpu-check-wheels: + {spec} (required by a downloaded wheel)")
        download(spec)
total = sum(w.stat().st_size for w in dest.glob("*.whl"))
print(f"gpu-check-wheels: {len(have())} wheels, {total / 2**20:.1f} MiB in {dest}")
EOF
