"""Warm worker interpreters for launcher-level restarts (docs/restarts.md, "The warm pool").

A new generation of workers spends seconds importing torch, torch.distributed.checkpoint
and NVRx before it can join the rendezvous. The node agent (`trainguard agent --pool K`)
runs a pool process (`trainguard.worker.pool`) that has done those imports once and keeps
K forked interpreters ready; the launcher's entrypoint becomes the shim
(`torchrun ... --no-python trainguard-worker train.py ARGS`, or
`python -m trainguard.worker train.py ARGS`), which imports nothing heavy, hands its argv,
environment, working directory and standard file descriptors to a warm interpreter, and
relays signals and the exit status, so the launcher sees an ordinary worker. Without a
reachable pool, or when every warm interpreter is taken, the shim runs the script itself,
cold.

This package's __init__ and `shim` import the standard library only: the shim runs in
every worker before anything else."""

from __future__ import annotations

import os
import warnings

POOL_ENV = "TRAINGUARD_WORKER_POOL"  # the pool's socket; "off" runs every worker cold
# Set in a warm worker's environment, for that pid only (the SDK reads them): the
# worker's parent is the pool, its launcher is the shim's parent.
WORKER_PID_ENV = "TRAINGUARD_WORKER_PID"
WORKER_PPID_ENV = "TRAINGUARD_WORKER_PPID"
WORKER_SHIM_ENV = "TRAINGUARD_WORKER_SHIM_PID"
OFF = ("0", "off", "none", "no", "false")

# NVRx 0.4 requires the deprecated `pynvml` distribution, which sits beside nvidia-ml-py
# (the NVML binding) and warns once per process at the first import of a `pynvml` module,
# whoever imports it: torch (torch.cuda), NVRx, the agent's NVML collector. Its advice is
# for NVRx's maintainers, not for the reader of a worker's or the agent's log.
PYNVML_DEPRECATED = "The pynvml package is deprecated"
# The same filter as a -W / PYTHONWARNINGS option, for processes started from here.
PYNVML_WARNINGS_OPTION = f"ignore:{PYNVML_DEPRECATED}:FutureWarning"


def ignore_pynvml_deprecation() -> None:
    """From now on this process does not print that one FutureWarning (a worker, the
    pool: processes trainguard starts, before the training script runs)."""
    warnings.filterwarnings("ignore", message=PYNVML_DEPRECATED, category=FutureWarning)


def pool_path_for(agent_socket: str | os.PathLike[str]) -> str:
    """The pool's socket beside the agent's: `<dir>/agent.sock` -> `<dir>/agent.pool.sock`
    (so two agents on one host, each with a socket of its own, have a pool each)."""
    base, ext = os.path.splitext(os.fspath(agent_socket))
    return f"{base}.pool{ext or '.sock'}"
