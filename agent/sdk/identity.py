"""Who a rank is: the job it belongs to, named the same on every node and across the
launcher's restarts (`job_identity()`), the launcher that runs it (`launcher_from_env()`)
and whether NVRx's inprocess.Wrapper runs its training function (`under_wrapper()`)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import sys
from collections.abc import Mapping
from types import FrameType
from typing import NamedTuple

from trainguard.protocol.launchers import DEFAULT_RUN_IDS, given_job
from trainguard.protocol.wire import wire_name

# The wire's `Name` (trainguard.protocol.wire): letters, digits and ._:@- (no "/": names
# are URL parts).
_NAME_BAD = re.compile(r"[^A-Za-z0-9._:@-]")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_LOOPBACK = frozenset({"", "localhost", "127.0.0.1", "::1", "0.0.0.0"})


class JobIdentity(NamedTuple):
    job: str  # the same on every node and across the launcher's restarts
    display_name: str  # readable: the script name and a short id
    launcher: str  # one of LAUNCHERS (trainguard.protocol.messages)
    source: str  # the rule that named the job (see job_identity)


def launcher_from_env(env: Mapping[str, str] | None = None) -> str:
    """Which launcher started this process, from what each puts in its workers'
    environment: ft_launcher (NVRx 0.4-0.7) adds FT_LAUNCHER_IPC_SOCKET and
    FT_RANK_MONITOR_IPC_SOCKET to torchrun's variables; torchrun (torch.distributed.elastic)
    sets TORCHELASTIC_RUN_ID; Slurm sets SLURM_JOB_ID in every task (and under srun,
    SLURM_STEP_ID). "none": a plain `python train.py` or a launcher of its own."""
    env = os.environ if env is None else env
    if env.get("FT_LAUNCHER_IPC_SOCKET") or env.get("FT_RANK_MONITOR_IPC_SOCKET"):
        return "ft_launcher"
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    if env.get("SLURM_JOB_ID"):
        return "slurm"
    return "none"


class RestartBudget(NamedTuple):
    """The launcher's restart budget as it tells its workers: `--max-restarts` and the
    restarts it has used (None: not started by torchrun or ft_launcher)."""

    max_restarts: int | None
    restart_count: int | None


def restart_budget_from_env(env: Mapping[str, str] | None = None) -> RestartBudget:
    """torchrun and ft_launcher put TORCHELASTIC_MAX_RESTARTS (`--max-restarts`, the
    whole job's budget: faults and operator restarts alike) and
    TORCHELASTIC_RESTART_COUNT (max_restarts minus the restarts it has left) in every
    worker's environment (torch `LocalElasticAgent._start_workers`); a value that is
    absent or no count is None."""
    env = os.environ if env is None else env

    def count(name: str) -> int | None:
        try:
            value = int(env.get(name, ""))
        except ValueError:
            return None
        return value if 0 <= value <= 2**31 - 1 else None

    return RestartBudget(count("TORCHELASTIC_MAX_RESTARTS"), count("TORCHELASTIC_RESTART_COUNT"))


def shared_store_warning(env: Mapping[str, str] | None = None) -> str:
    """A line for workers that torchrun restarts on the rendezvous store of the previous
    generation, "" otherwise. torch 2.13's elastic agent keeps one TCPStore for the life
    of the launcher (the static rendezvous always, c10d unless
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1) and gives its workers no per-restart key
    prefix, so init_process_group of a new generation can read a dead peer's gloo (or
    NCCL) address and fail with "Connection refused" (docs/restarts.md, "Plain torchrun
    restarts"). ft_launcher is not concerned."""
    env = os.environ if env is None else env
    if launcher_from_env(env) != "torchrun":
        return ""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return ""
    try:
        restarts = int(env.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    except ValueError:
        return ""
    if restarts <= 0:
        return ""
    return (
        "torchrun restarts this job on the store of its previous generation, where a new "
        "process group can read a dead peer's address (Connection refused); launch with "
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 and --rdzv-backend c10d, or build the process "
        "group on a store prefix of its own per restart (docs/restarts.md)"
    )


def _script_name(argv0: str) -> str:
    base = os.path.basename(argv0.rstrip("/"))
    stem = base[:-3] if base.endswith(".py") else base
    if stem == "__main__":  # python -m package
        stem = os.path.basename(os.path.dirname(argv0.rstrip("/")))
    if stem in ("", "-c", "-m", "-"):
        stem = "python"
    return _NAME_BAD.sub("-", stem).strip("-._:@")[:40] or "python"


def _short_id(job: str) -> str:
    if len(job) <= 16:
        return job
    if _UUID.match(job):  # torchrun's --standalone (and single-node default) run id
        return job[:8]
    return hashlib.sha1(job.encode()).hexdigest()[:8]


def parent_pid(env: Mapping[str, str] | None = None) -> int:
    """The process that started this rank as the launcher sees it. A warm worker
    (trainguard.worker: forked by the node's pool, driven by the shim the launcher
    started) has the pool as its parent; the shim's parent, the launcher, is in
    TRAINGUARD_WORKER_PPID, set for the worker's own pid only (TRAINGUARD_WORKER_PID),
    so a process the worker starts does not take it for its own."""
    env = os.environ if env is None else env
    if env.get("TRAINGUARD_WORKER_PID", "") == str(os.getpid()):
        with contextlib.suppress(ValueError):
            ppid = int(env.get("TRAINGUARD_WORKER_PPID", ""))
            if ppid > 0:
                return ppid
    return os.getppid()


def _start_ticks(pid: int) -> str:
    """The process's start time (clock ticks since boot), so a reused pid is another name."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
        return raw[raw.rfind(")") + 2 :].split()[19]
    except (OSError, IndexError):
        return ""


def job_identity(
    env: Mapping[str, str] | None = None,
    argv0: str | None = None,
    *,
    pid: int | None = None,
    ppid: int | None = None,
    host: str | None = None,
) -> JobIdentity:
    """The job this process belongs to, the first rule that applies naming it:

    1. TRAINGUARD_JOB (source "TRAINGUARD_JOB");
    2. Slurm's job id, with the step under srun: `1234.0` ("slurm");
    3. the launcher's run id (torchrun's/ft_launcher's --rdzv-id, TORCHELASTIC_RUN_ID)
       unless it is the default `none` ("run_id"; a single-node torchrun without
       --rdzv-id draws a UUID, the same in every worker and restart);
    4. no id: a name derived from what all ranks share, `<script>-<12 hex>`:
       - ranks on several nodes: the master address and port the launcher gives every
         worker ("master_address"; torchrun keeps them across restarts, ft_launcher 0.4
         draws a new port at each: pass --rdzv-id there);
       - ranks of one node: the launcher process (host, pid, start time) that respawns
         them ("launcher_process"; also the parent of torch.multiprocessing.spawn);
       - one process, no launcher (`python train.py`): the process itself ("process").

    The display name is TRAINGUARD_JOB_NAME, else the job itself when it was given
    (TRAINGUARD_JOB) or derived, else `<script>-<short id>` (`train-1234.0`,
    `train-3f2a1c4d` for a UUID)."""
    env = os.environ if env is None else env
    script = _script_name(sys.argv[0] if argv0 is None else argv0)
    launcher = launcher_from_env(env)
    given_display = env.get("TRAINGUARD_JOB_NAME", "").strip()

    def named(job: str, source: str, display: str | None = None) -> JobIdentity:
        job = wire_name(job)
        shown = given_display or display or f"{script}-{_short_id(job)}"
        return JobIdentity(job, wire_name(shown), launcher, source)

    given = given_job(env)  # the rule a launcher's job is read with too (protocol)
    if given and env.get("TRAINGUARD_JOB", "").strip():
        return named(given, "TRAINGUARD_JOB", wire_name(given))
    if given:
        return named(given, "slurm")
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id.lower() not in DEFAULT_RUN_IDS:
        return named(run_id, "run_id")
    host = socket.gethostname() if host is None else host
    master = (env.get("MASTER_ADDR", "").strip(), env.get("MASTER_PORT", "").strip())
    world = env.get("WORLD_SIZE", "1").strip() or "1"
    if launcher in ("torchrun", "ft_launcher"):
        several_nodes = env.get("GROUP_WORLD_SIZE", "1").strip() not in ("", "1")
    else:
        several_nodes = world != "1" and master[0].lower() not in _LOOPBACK
    if several_nodes and all(master):
        basis, source = f"master {master[0]}:{master[1]}", "master_address"
    elif launcher != "none" or world != "1":
        parent = parent_pid(env) if ppid is None else ppid
        basis, source = f"launcher {host} {parent} {_start_ticks(parent)}", "launcher_process"
    else:
        own = os.getpid() if pid is None else pid
        basis, source = f"process {host} {own} {_start_ticks(own)}", "process"
    job = f"{script}-{hashlib.sha1(f'{script} {basis}'.encode()).hexdigest()[:12]}"
    return named(job, source, job)


def env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


# --- capabilities: is this rank under NVRx's in-process Wrapper? ----------------------

WRAP_MODULE = "nvidia_resiliency_ext.inprocess.wrap"


_UNKNOWN_WRAPPER = object()  # a Wrapper's frame whose Wrapper object could not be read


def running_wrapper(frame: FrameType | None = None) -> object | None:
    """The NVRx `inprocess.Wrapper` whose `CallWrapper.__call__` frame is on the stack of
    `frame` (default: the caller's), or None. Every wrapped call runs there, from NVRx
    0.4.1 to 0.7 (0.6 deprecated the Wrapper but kept it). Nothing is imported: without
    NVRx loaded the answer is None."""
    if WRAP_MODULE not in sys.modules:
        return None
    f: FrameType | None = sys._getframe(1) if frame is None else frame
    while f is not None:
        code = f.f_code
        if (
            code.co_qualname == "CallWrapper.__call__"
            and f.f_globals.get("__name__") == WRAP_MODULE
        ):
            return getattr(f.f_locals.get("self"), "wrapper", None) or _UNKNOWN_WRAPPER
        f = f.f_back
    return None


def under_wrapper(frame: FrameType | None = None) -> bool:
    """Whether NVRx's inprocess.Wrapper is running the code of `frame` (default: the
    caller's); see `running_wrapper`."""
    return running_wrapper(sys._getframe(1) if frame is None else frame) is not None


# NVRx 0.5+ chains these NVML checks into every Wrapper whose process has LOCAL_RANK
# (`Wrapper._construct_restart_health_check`) and runs them before each in-process restart;
# where NVML cannot start they fail, and the restart ends as a launcher restart.
NVML_CHECKS = frozenset({"ChainedGPUHealthCheck", "ChainedNVLHealthCheck"})
HEALTH_MODULE = "nvidia_resiliency_ext.inprocess.health_check"


def nvml_missing() -> str | None:
    """Why NVIDIA's management library cannot load in this process (no driver: a CPU
    host), or None when it loads. The same library load pynvml does, nothing more."""
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as exc:
        return str(exc)
    return None


def in_process_blocker(wrapper: object) -> str | None:
    """Why `wrapper` (from `running_wrapper`) cannot restart in process on this host, or
    None. Today one reason: NVRx's own NVML health checks run before every restart and
    NVML does not load here."""
    check = getattr(wrapper, "restart_health_check", None)
    instances = getattr(check, "instances", None) or ([check] if check is not None else [])
    nvml = sorted(
        type(c).__name__
        for c in instances
        if type(c).__name__ in NVML_CHECKS and type(c).__module__ == HEALTH_MODULE
    )
    if not nvml:
        return None
    missing = nvml_missing()
    if missing is None:
        return None
    return (
        f"NVRx's Wrapper runs {', '.join(nvml)} before every in-process restart and NVML "
        f"does not load here ({missing}): each in-process restart would end the ranks"
    )
