#!/usr/bin/env bash
# The device check, for the day a GPU machine is lent: `trainguard bench gpu`
# (backend/bench/gpucheck.py) from this checkout, under a hard time limit.
#
# It starts a `trainguard server` (SQLite in a temporary folder) and the real NVML agent,
# runs a tiny CUDA/NCCL job under torchrun and under ft_launcher + NVRx's Wrapper, cold
# and warm (the agent's --pool and the trainguard-worker shim), fires an exception and a
# SIGKILL in each, and prints one table: recovery per fault and mode (trainguard's
# incidents and the script's own view) and the agent's GPU readings. Anything missing
# (NVML, CUDA, NCCL, NVRx) skips what needs it with one line. docs/restarts.md, "On a GPU
# machine", says what each column means and holds the results.
#
# The machine needs Python 3.12 and torch; the rest comes as wheels in .whl/:
#
#   # where an index is reachable (not committed; ~40 MiB):
#   deploy/gpu-check-wheels.sh                      # -> .whl/*.whl
#   # on the GPU machine, in the checkout (this script does it when the imports fail):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site
#   deploy/gpu-check.sh                             # the check: under 6 minutes
#   deploy/gpu-check.sh --cpu --jobs torchrun-cold  # gloo and simulated GPUs (testing)
#
# trainguard itself is imported from this checkout: unless it imports already (an
# editable install), deploy/gpu-check-tree.py links its folders into a `trainguard`
# namespace with the entry points (the wheel would leave the benchmarks out).
#
# Settings: PYTHON (default python3), GPU_CHECK_TIMEOUT (hard limit in seconds, default
# 350; the check itself stops waiting 25 s before it), GPU_CHECK_SITE (where the wheels
# are installed, default /tmp/site), GPU_CHECK_TREE (default /tmp/trainguard-tree-$UID).
# Arguments go to the check (`--help`: --cpu, --jobs, --faults, --nproc, --json, --workdir).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
LIMIT=${GPU_CHECK_TIMEOUT:-350}
SITE=${GPU_CHECK_SITE:-/tmp/site}
TREE=${GPU_CHECK_TREE:-/tmp/trainguard-tree-$(id -u)}
DEPS='import fastapi, sqlalchemy, alembic, uvicorn, pydantic_settings, httpx, typer, msgspec, pynvml, prometheus_client, yaml'

if ! "$PYTHON" -c "$DEPS" 2>/dev/null; then
    if compgen -G "$REPO/.whl/*.whl" >/dev/null; then
        echo "gpu-check: installing $REPO/.whl/*.whl into $SITE" >&2
        if ! "$PYTHON" -m pip install -q --no-index --no-deps --target "$SITE" "$REPO"/.whl/*.whl; then
            echo "gpu-check: the wheels in .whl/ did not install (they are for CPython 3.12 on x86_64 Linux; $PYTHON is $("$PYTHON" -V 2>&1))" >&2
            exit 2
        fi
        export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    fi
    if ! err=$("$PYTHON" -c "$DEPS" 2>&1); then
        echo "gpu-check: the server's and agent's dependencies do not import ($(tail -n1 <<<"$err")); run deploy/gpu-check-wheels.sh where an index is reachable and copy .whl/ here" >&2
        exit 2
    fi
fi

here=$("$PYTHON" -c 'import os, trainguard.backend.bench.gpucheck as g; print(os.path.realpath(g.__file__))' 2>/dev/null || true)
if [[ "$here" != "$REPO/backend/bench/gpucheck.py" ]]; then
    "$PYTHON" "$REPO/deploy/gpu-check-tree.py" "$TREE"
    export PYTHONPATH="$TREE${PYTHONPATH:+:$PYTHONPATH}"
fi

exec timeout -k 10 "$LIMIT" "$PYTHON" -m trainguard.backend.bench.gpucheck \
    --timeout "$((LIMIT - 25))" "$@"
