"""Start the demo training job: two NVRx ft_launchers x 2 ranks that stand for two nodes.

Each launcher's workers talk to their own agent (one socket per imitated node, through
TRAINGUARD_AGENT_SOCKET); both launchers meet in a c10d rendezvous on 127.0.0.1; the
Wrapper's store is the one hosted at `store_port` (by the first node's agent, or
`python -m trainguard.agent.executors.storehost`). The launcher flags are the ones measured in
docs/restarts.md, each passed only when the installed ft_launcher has it
(`launcher_options` reads its `--help` once).

The demo (backend/demo.py) and the benchmarks use it; it talks to agents only through
their sockets, so the backend needs nothing of the agent for it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# trainguard.worker.PYNVML_WARNINGS_OPTION (the backend imports nothing of the agent): NVRx
# 0.4's deprecated `pynvml` distribution warns in ft_launcher and in every worker.
_QUIET_PYNVML = "ignore:The pynvml package is deprecated:FutureWarning"

# The repository in a checkout, site-packages/trainguard in an install: examples/ (package
# data trainguard.examples) lies under both.
ROOT = Path(__file__).resolve().parents[1]
TRAIN_SCRIPT = ROOT / "examples" / "train_demo.py"


def free_port(low: int = 20000, high: int = 32000) -> int:
    """A free TCP port below the ephemeral range (for the rendezvous and the store)."""
    import random

    for _ in range(200):
        port = random.randint(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below 32768")


# The measured ft_launcher configuration (docs/restarts.md), flag and value. Each is passed
# only when the installed ft_launcher accepts it: NVRx 0.6 keeps `--ft-restart-policy` for
# `any-failed` alone (its default) and may drop the flag; the others exist in 0.4.1-0.7.
FT_OPTIONS: tuple[tuple[str, str], ...] = (
    ("--monitor-interval", "0.5"),
    ("--workers-stop-timeout", "5"),
    ("--ft-restart-policy", "min-healthy"),
    ("--ft-enable-nic-monitor", "false"),
    ("--ft-initial-rank-heartbeat-timeout", "60"),
    ("--ft-rank-heartbeat-timeout", "20"),
    ("--ft-workload-check-interval", "1"),
)

# NVRx 0.7's barrier rendezvous closes for good when two ft_launchers of one job share a
# host ("Detected multiple participants on the same node ... Permanently closing the
# rendezvous"), unless this switch is set: upstream's own override "for intentional
# simulation". The demo, the benchmarks and the tests imitate several nodes with several
# launchers on one machine, so they set it for those launchers, and only then: trainguard
# never sets it for a real node (docs/restarts.md, "NVRx versions").
SIMULATED_NODES_ENV = "NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE"


def simulation_env(launchers_on_this_host: int) -> dict[str, str]:
    """The environment for ft_launchers that imitate that many nodes on this one host."""
    return {SIMULATED_NODES_ENV: "1"} if launchers_on_this_host > 1 else {}


_OPTION = re.compile(r"(--?[A-Za-z0-9][\w-]*)(?: (\{[^}]*\}))?")


def ft_launcher_head() -> list[str]:
    """How to run this environment's ft_launcher."""
    launcher = Path(sys.executable).with_name("ft_launcher")
    if launcher.exists():
        return [str(launcher)]
    return [sys.executable, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher"]


def parse_help_options(text: str) -> dict[str, frozenset[str] | None]:
    """The options an argparse `--help` lists, each with its choices (None: any value).
    Only the option lines count (two spaces, then a dash), not flags named in help prose."""
    found: dict[str, frozenset[str] | None] = {}
    for line in text.splitlines():
        if not line.startswith("  -"):
            continue
        invocation = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        for flag, choices in _OPTION.findall(invocation):
            found[flag] = frozenset(choices.strip("{}").split(",")) if choices else None
    return found


@functools.lru_cache(maxsize=4)
def launcher_options(head: tuple[str, ...]) -> dict[str, frozenset[str] | None] | None:
    """The options of the launcher run by `head`, from its `--help` (once per process);
    None when it cannot tell (no such launcher, or it failed)."""
    try:
        out = subprocess.run(
            [*head, "--help"],
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, "COLUMNS": "1000"},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    options = parse_help_options(out.stdout)
    return options if out.returncode == 0 and options else None


def supported_options(
    wanted: tuple[tuple[str, str], ...], options: dict[str, frozenset[str] | None] | None
) -> list[str]:
    """`wanted` as arguments, without the flags (or values) the launcher does not accept.
    Unknown options (None): all of them, as measured."""
    args: list[str] = []
    for flag, value in wanted:
        if options is not None:
            if flag not in options:
                continue
            choices = options[flag]
            if choices is not None and value not in choices:
                continue
        args += [flag, value]
    return args


def launcher_command(
    nnodes: int,
    nproc_per_node: int,
    rdzv_port: int,
    job: str,
    max_restarts: int,
    train_args: list[str],
    *,
    script: str | os.PathLike[str] = TRAIN_SCRIPT,
    shim: bool = False,
    launcher: str = "ft_launcher",
    rdzv_host: bool = True,
    min_nodes: int | None = None,
) -> list[str]:
    """The launcher line: ft_launcher with the measured flags it accepts, or (`launcher`
    "torchrun", a job without NVRx) the README's torchrun line, to run with
    `TORCHRUN_ENV`, the Wrapper left out (`--no-wrapper`). Both on a c10d rendezvous on
    loopback. With `shim`, the workers start through trainguard's worker shim
    (`--no-python trainguard-worker SCRIPT`), warm when the node's agent runs a pool
    (agent/worker/, docs/restarts.md "The warm pool"). With `min_nodes`, the job is
    elastic: `--nnodes MIN:MAX`, it re-forms with fewer nodes when one leaves."""
    if launcher == "ft_launcher":
        head = ft_launcher_head()
        flags = supported_options(FT_OPTIONS, launcher_options(tuple(head)))
        tail: list[str] = []
    else:
        head = [sys.executable, "-m", "torch.distributed.run"]
        flags, tail = ["--monitor-interval", "0.5"], ["--no-wrapper"]
    span = f"{min_nodes}:{nnodes}" if min_nodes is not None else str(nnodes)
    return [
        *head,
        *("--nnodes", span, "--nproc-per-node", str(nproc_per_node)),
        *("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{rdzv_port}"),
        *("--rdzv-id", job, "--max-restarts", str(max_restarts)),
        *(() if rdzv_host else ("--rdzv-conf", "is_host=0")),
        *flags,
        *(worker_shim() if shim else []),
        str(script),
        *train_args,
        *tail,
    ]


# torchrun restarts on the previous generation's store unless this is set (docs/restarts.md,
# "Plain torchrun restarts").
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def worker_shim() -> list[str]:
    """The launcher arguments that start each worker through the shim."""
    exe = Path(sys.executable).with_name("trainguard-worker")
    if exe.exists():
        return ["--no-python", str(exe)]
    return ["-m", "trainguard.worker"]


def launch(
    workdir: str | os.PathLike[str],
    agent_sockets: list[str],
    store_port: int,
    *,
    job: str = "demo",
    steps: int = 2000,
    ckpt_every: int = 20,
    nproc_per_node: int = 2,
    max_restarts: int = 3,
    faults: int = 0,
    fault_seed: int = 42,
    fault_after_step: int = 10,
    fault_kinds: str | None = None,
    fault_min_gap: int = 1,
    fault_rank: int | None = None,
    step_sleep: float = 0.0,
    rdzv_port: int | None = None,
    store_host: str = "127.0.0.1",
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    shim: bool = False,
    launcher: str = "ft_launcher",
    nnodes: int | None = None,
    rdzv_host: bool = True,
    only: int | None = None,
    spare_delay_s: float = 0.0,
    min_nodes: int | None = None,
) -> list[subprocess.Popen[bytes]]:
    """One launcher per agent socket (= per imitated node); returns the launchers.
    `launcher` "ft_launcher" (the Wrapper inside) or "torchrun" (no NVRx: launcher
    restarts only). Their output goes to <workdir>/launcher-<i>.log.

    `nnodes`: the round's size (default: one node per socket); a launcher beyond it waits
    as a hot spare. `rdzv_host` False: no launcher hosts the rendezvous store, which is
    already served at `rdzv_port` (the first node's agent's store), so a node that leaves
    the job does not take it along. `only`: start node `only`'s launcher alone (a node
    back from repair, as its scheduler would). `spare_delay_s`: the launchers beyond
    `nnodes` start this much later, once the round has formed (NVRx 0.7's barrier
    rendezvous does not complete when a spare joins the first round with the others).
    `min_nodes`: an elastic job (`--nnodes MIN:MAX`, MAX = `nnodes`)."""
    if launcher not in ("ft_launcher", "torchrun"):
        raise ValueError(f"launcher must be ft_launcher or torchrun, not {launcher!r}")
    work = Path(workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    rdzv_port = rdzv_port or free_port()
    train_args = [
        "--steps",
        str(steps),
        "--ckpt-every",
        str(ckpt_every),
        "--workdir",
        str(work),
        "--job",
        job,
        "--store-host",
        store_host,
        "--store-port",
        str(store_port),
        "--step-sleep",
        str(step_sleep),
    ]
    if faults:
        train_args += [
            "--faults",
            str(faults),
            "--fault-seed",
            str(fault_seed),
            "--fault-after-step",
            str(fault_after_step),
            "--fault-min-gap",
            str(fault_min_gap),
        ]
        if fault_rank is not None:
            train_args += ["--fault-rank", str(fault_rank)]
        if fault_kinds:
            train_args += ["--fault-kinds", fault_kinds]
    train_args += extra_args or []
    procs = []
    for i, sock in enumerate(agent_sockets):
        if only is not None and i != only:
            continue
        child_env = dict(os.environ)
        if launcher == "ft_launcher":
            child_env.update(simulation_env(len(agent_sockets)))
        else:
            child_env.update(TORCHRUN_ENV)
        child_env.update(env or {})
        child_env.update(
            TRAINGUARD_AGENT_SOCKET=sock,
            TRAINGUARD_JOB=job,
            OMP_NUM_THREADS="1",
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), child_env.get("PYTHONPATH")])),
            PYTHONUNBUFFERED="1",
            # ft_launcher and the workers import NVRx and torch, which import pynvml.
            PYTHONWARNINGS=",".join(filter(None, [child_env.get("PYTHONWARNINGS"), _QUIET_PYNVML])),
        )
        cmd = launcher_command(
            nnodes or len(agent_sockets),
            nproc_per_node,
            rdzv_port,
            job,
            max_restarts,
            train_args,
            shim=shim,
            launcher=launcher,
            rdzv_host=rdzv_host,
            min_nodes=min_nodes,
        )
        if spare_delay_s > 0 and only is None and nnodes is not None and i >= nnodes:
            cmd = ["/bin/sh", "-c", f'sleep {spare_delay_s:g}; exec "$@"', "sh", *cmd]
        log = open(work / f"launcher-{i}.log", "ab")  # noqa: SIM115 - owned by the child
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=str(work),
                env=child_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        log.close()
    return procs


def _stat(pid: int | str) -> tuple[int, str, int] | None:
    """(parent pid, state, start time in clock ticks) from /proc/<pid>/stat; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()  # the command name may hold spaces and ")"
    return int(fields[1]), fields[0], int(fields[19])


def _table() -> dict[int, tuple[int, str, int]]:
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(entry)) is not None:
            table[int(entry)] = st
    return table


def process_tree(pid: int) -> dict[int, int]:
    """Every process below pid, as {pid: start ticks} (the start time tells a process from a
    later one that reuses its pid). ft_launcher starts its workers in sessions of their own,
    so signalling the launcher's process group does not reach them; NVRx's Wrapper
    daemonizes a monitor process per rank, which leaves the tree unless an ancestor is a
    subreaper (`become_subreaper`)."""
    table = _table()
    kids: dict[int, list[int]] = {}
    for child, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(child)
    out, todo = {}, [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out[child] = table[child][2]
            todo.append(child)
    return out


def descendants(pid: int) -> list[int]:
    """Every process below pid (see `process_tree`)."""
    return list(process_tree(pid))


def alive(pid: int, start: int) -> bool:
    """The process recorded as (pid, start ticks) still runs (a zombie has ended)."""
    st = _stat(pid)
    return st is not None and st[2] == start and st[1] not in ("Z", "X")


def become_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (Linux PR_SET_CHILD_SUBREAPER), so
    that daemonized ones stay in its `process_tree`. False where the OS does not allow it."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(36, 1, 0, 0, 0) == 0)  # 36: PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def reap_adopted(keep: set[int]) -> None:
    """Collect the exit status of this process's ended children other than `keep` (the
    Popen objects' own, which they collect themselves): orphans adopted as a subreaper."""
    me = os.getpid()
    for pid, (ppid, state, _) in _table().items():
        if ppid == me and state == "Z" and pid not in keep:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def end_processes(procs: dict[int, int], grace: float) -> dict[int, int]:
    """SIGTERM to every process of {pid: start ticks}, SIGKILL to those still running after
    `grace` seconds; returns once all have ended (or 2 s after the SIGKILL) with those that
    have not."""

    def send(sig: signal.Signals, pids: dict[int, int]) -> None:
        for pid, start in pids.items():
            if alive(pid, start):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    def wait(timeout: float) -> dict[int, int]:
        deadline = time.monotonic() + timeout
        while True:
            left = {pid: start for pid, start in procs.items() if alive(pid, start)}
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.05)

    send(signal.SIGTERM, procs)
    left = wait(grace)
    send(signal.SIGKILL, left)
    return wait(2.0) if left else left


def stop(procs: list[subprocess.Popen[bytes]], grace: float = 15.0) -> None:
    """Stop the demo job: SIGTERM to the launchers (they stop their workers), then SIGKILL
    to whatever is left of them and of their workers after `grace` seconds."""
    workers = {pid: t for p in procs if p.poll() is None for pid, t in process_tree(p.pid).items()}
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    for pid, start in workers.items():
        if alive(pid, start):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
