"""The in-training SDK: a few lines in a training script report to the node agent.

    from trainguard import sdk
    tg = sdk.attach()                  # job, rank, world size, attempt from the environment
    for n in range(steps):
        with tg.step(n):               # never blocks; raises RestartRequested at a boundary
            train_one_step()

The standard library and trainguard.protocol only (msgspec comes with the protocol).
Every report is one datagram of trainguard.protocol.messages over a Unix socket. The
agent's socket is found with no configuration: TRAINGUARD_AGENT_SOCKET when set, else the
first of the well-known places an agent listens on (`socket_candidates()`:
/run/trainguard/agent.sock, $XDG_RUNTIME_DIR/trainguard/agent.sock,
/tmp/trainguard-<uid>/agent.sock; the agent binds the first it can create). No agent: one
line on stderr, and training goes on. Sends are non-blocking (MSG_DONTWAIT): when the
agent is absent or its buffer is full the message is dropped and counted, training never
waits. The agent answers on the same socket (the SDK binds an abstract address), which is
how a restart request reaches the rank.

The job is named the same on every node and across the launcher's restarts
(`job_identity()`), and each rank declares what it supports: which launcher runs it and
whether NVRx's inprocess.Wrapper runs its training function (`under_wrapper()`).

Restart requests (`in_process` from the agent) set a flag; the step hook raises
`RestartRequested` at the next step boundary, or SIGUSR1 does inside a step that lasts
(trainguard.sdk.restart). An exception that leaves a step, or that nothing catches, is
reported once, before the process dies (trainguard.sdk.hooks); the goodbye at exit says
whether the rank ended cleanly.

The modules: `identity` (job, launcher, Wrapper),
`transport` (the socket), `session` (the step hook and the reports), `restart`, `hooks`.
"""

from __future__ import annotations

import contextlib
import os
import sys

from trainguard.protocol.discovery import (
    SOCKET_DIRS_ENV,
    SOCKET_ENV,
    SOCKET_NAME,
    default_socket_path,
    find_socket,
    probe_socket,
    socket_candidates,
)
from trainguard.protocol.messages import LAUNCHERS
from trainguard.protocol.wire import wire_name
from trainguard.sdk import hooks
from trainguard.sdk.identity import (
    JobIdentity,
    RestartBudget,
    env_int,
    in_process_blocker,
    job_identity,
    launcher_from_env,
    nvml_missing,
    restart_budget_from_env,
    running_wrapper,
    shared_store_warning,
    under_wrapper,
)
from trainguard.sdk.restart import RestartRequested
from trainguard.sdk.session import FLUSH_INTERVAL_S, Session

__all__ = [
    "FLUSH_INTERVAL_S",
    "LAUNCHERS",
    "SOCKET_DIRS_ENV",
    "SOCKET_ENV",
    "SOCKET_NAME",
    "JobIdentity",
    "RestartBudget",
    "RestartRequested",
    "Session",
    "attach",
    "current",
    "default_socket_path",
    "find_socket",
    "in_process_blocker",
    "job_identity",
    "launcher_from_env",
    "nvml_missing",
    "probe_socket",
    "restart_budget_from_env",
    "running_wrapper",
    "shared_store_warning",
    "socket_candidates",
    "under_wrapper",
    "wire_name",
]

_current: Session | None = None


def attach(
    job: str | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    attempt: int | None = None,
    socket_path: str | None = None,
    heartbeat_interval: float = 1.0,
    signal_after: float = 2.0,
    install_signal_handler: bool = True,
    flush_interval: float = FLUSH_INTERVAL_S,
    *,
    in_process: bool | None = None,
    launcher: str | None = None,
    display_name: str | None = None,
) -> Session:
    """Attach this process to the node agent; arguments override the environment: the
    job and its display name (job_identity: TRAINGUARD_JOB, Slurm, the launcher's run
    id ...), RANK, LOCAL_RANK, WORLD_SIZE, TORCHELASTIC_RESTART_COUNT, the launcher
    (launcher_from_env) and its restart budget (restart_budget_from_env), the socket
    (TRAINGUARD_AGENT_SOCKET, else the well-known ones).
    `in_process=True` declares that NVRx's inprocess.Wrapper runs the training function
    (None: detected, see under_wrapper). A missing agent is not an error: it is said
    once on stderr and training goes on."""
    global _current
    if _current is not None:
        _current.close()
    ident = job_identity()
    if job:
        name = wire_name(job)
        ident = ident._replace(job=name, display_name=wire_name(display_name or name))
    elif display_name:
        ident = ident._replace(display_name=wire_name(display_name))
    local = local_rank if local_rank is not None else env_int("LOCAL_RANK", 0)
    budget = restart_budget_from_env()
    found: str | None = socket_path
    if socket_path:
        why = probe_socket(socket_path)
        problem = f"{socket_path}: {why}" if why else ""
    else:
        found, problem = find_socket()
    _current = Session(
        job=ident.job,
        rank=rank if rank is not None else env_int("RANK", 0),
        local_rank=local,
        world_size=world_size if world_size is not None else env_int("WORLD_SIZE", 1),
        attempt=attempt if attempt is not None else env_int("TORCHELASTIC_RESTART_COUNT", 0),
        socket_path=found,
        heartbeat_interval=heartbeat_interval,
        signal_after=signal_after,
        install_signal_handler=install_signal_handler,
        flush_interval=flush_interval,
        display_name=ident.display_name,
        launcher=launcher or ident.launcher,
        in_process=in_process,
        max_restarts=budget.max_restarts,
        restart_count=budget.restart_count,
        discover=not socket_path and not os.environ.get(SOCKET_ENV, "").strip(),
    )
    hooks.install(_live)
    if local == 0:
        if problem:
            _say_once(
                "agent",
                f"no node agent reached ({problem}); training goes on, "
                "its reports are dropped until an agent listens",
            )
        if warning := shared_store_warning():
            _say_once("store", warning)
        if ident.source == "master_address" and not job:
            _say_once(
                "job",
                f"job named {ident.job} after MASTER_ADDR:MASTER_PORT (no TRAINGUARD_JOB, "
                "Slurm job or --rdzv-id): a restart on a new master port makes a new job; "
                "set --rdzv-id or TRAINGUARD_JOB",
            )
    return _current


_said: set[str] = set()


def _say_once(key: str, line: str) -> None:
    """One line on stderr, once per process and topic."""
    if key in _said:
        return
    _said.add(key)
    with contextlib.suppress(OSError, ValueError):
        print(f"trainguard: {line}", file=sys.stderr, flush=True)


def current() -> Session | None:
    return _current


def _live() -> Session | None:
    """The attached session while it is open: where uncaught exceptions and sys.exit()
    are reported."""
    s = _current
    return s if s is not None and not s._closed.is_set() else None
