"""The in-training SDK: a few lines in a training script report to the node agent.

    from trainguard import sdk
    tg = sdk.attach()                  # job, rank, world size, attempt from the environment
    for n in range(steps):
        with tg.step(n):               # never blocks; raises RestartRequested at a boundary
            train_one_step()

Standard library only. Everything travels as one JSON datagram over a Unix socket. The
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
`RestartRequested` at the next step boundary. A rank that stays inside one step for longer
than `signal_after` seconds after the request gets SIGUSR1 through signal.pthread_kill; the
handler raises in the main thread. Both are ordinary exceptions in the training function,
so NVRx's inprocess.Wrapper restarts every rank. (PyThreadState_SetAsyncExc is never used:
NVRx's progress watchdog swallows such exceptions.)

An exception that leaves a step, or that nothing catches (sys.excepthook,
threading.excepthook; the previous hooks still run), is reported once, before the process
dies; the goodbye at exit says whether the rank ended cleanly.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import math
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import Any, NamedTuple

__all__ = [
    "FLUSH_INTERVAL_S",
    "LAUNCHERS",
    "JobIdentity",
    "RestartRequested",
    "Session",
    "attach",
    "current",
    "default_socket_path",
    "find_socket",
    "job_identity",
    "launcher_from_env",
    "probe_socket",
    "shared_store_warning",
    "socket_candidates",
    "under_wrapper",
    "wire_name",
]

# The wire's `Name` (agent/wire.py): letters, digits and ._:@- (no "/": names are URL parts).
_NAME_BAD = re.compile(r"[^A-Za-z0-9._:@-]")

# Queued steps are sent at most this often. A step is sent at once when nothing was
# sent for this long (slow steps arrive as they end, so the agent's hang check sees
# them) and when it is the first of a generation (after attach, a new iteration or a
# raised restart: the agent's `resumed` waits for it).
FLUSH_INTERVAL_S = 1.0

SOCKET_ENV = "TRAINGUARD_AGENT_SOCKET"  # the socket, on both sides (overrides discovery)
SOCKET_DIRS_ENV = "TRAINGUARD_SOCKET_DIRS"  # the well-known folders, ":"-separated (tests)
SOCKET_NAME = "agent.sock"

LAUNCHERS = ("torchrun", "ft_launcher", "slurm", "none")
# torchrun's and ft_launcher's --rdzv-id default: the same string for every job.
_DEFAULT_RUN_IDS = frozenset({"", "none"})
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_LOOPBACK = frozenset({"", "localhost", "127.0.0.1", "::1", "0.0.0.0"})


class RestartRequested(Exception):
    """Raised inside the training function when the agent asked for an in-process restart."""


# --- finding the agent ----------------------------------------------------------------


def socket_candidates(env: Mapping[str, str] | None = None) -> list[str]:
    """The well-known places of a node's agent socket, in the order both sides try them:
    /run/trainguard (an agent run as root), $XDG_RUNTIME_DIR/trainguard (default
    /run/user/<uid>/trainguard), /tmp/trainguard-<uid>. TRAINGUARD_SOCKET_DIRS (folders
    separated by ":") replaces the list, for tests and unusual hosts."""
    env = os.environ if env is None else env
    override = [d for d in env.get(SOCKET_DIRS_ENV, "").split(os.pathsep) if d.strip()]
    if override:
        dirs = override
    else:
        uid = os.getuid()
        runtime = env.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
        dirs = ["/run/trainguard", os.path.join(runtime, "trainguard"), f"/tmp/trainguard-{uid}"]
    return [os.path.join(d, SOCKET_NAME) for d in dirs]


def probe_socket(path: str) -> str:
    """'' when an agent listens on `path`, else why not, in a few words."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)  # a datagram connect sends nothing: it only finds the receiver
        return ""
    except FileNotFoundError:
        return "no such file"
    except ConnectionRefusedError:
        return "nobody listens there"
    except PermissionError:
        return "permission denied"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    finally:
        probe.close()


def find_socket(env: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """The agent's socket and, when no agent listens there, why (else '').
    TRAINGUARD_AGENT_SOCKET is taken as it is (reports go there, and reach an agent that
    starts later); otherwise the first well-known socket an agent listens on, or None."""
    env = os.environ if env is None else env
    explicit = env.get(SOCKET_ENV, "").strip()
    if explicit:
        why = probe_socket(explicit)
        return explicit, f"{explicit} ({SOCKET_ENV}): {why}" if why else ""
    return _listening_candidate(env)


def _listening_candidate(env: Mapping[str, str]) -> tuple[str | None, str]:
    tried = []
    for path in socket_candidates(env):
        why = probe_socket(path)
        if not why and not _owned_by_us_or_root(os.path.dirname(path)):
            why = "its folder belongs to another user"  # /tmp is everyone's: not theirs
        if not why:
            return path, ""
        tried.append(f"{path}: {why}")
    return None, "; ".join(tried)


def _owned_by_us_or_root(folder: str) -> bool:
    try:
        return os.stat(folder).st_uid in (os.getuid(), 0)
    except OSError:
        return False


def default_socket_path() -> str:
    """TRAINGUARD_AGENT_SOCKET, else the well-known socket an agent listens on, else the
    first well-known place."""
    path, _ = find_socket()
    return path or socket_candidates()[0]


# --- naming the job -------------------------------------------------------------------


class JobIdentity(NamedTuple):
    job: str  # the same on every node and across the launcher's restarts
    display_name: str  # readable: the script name and a short id
    launcher: str  # one of LAUNCHERS
    source: str  # the rule that named the job (see job_identity)


def wire_name(text: str) -> str:
    """`text` made into a wire name (1-128 characters of the allowed set)."""
    name = _NAME_BAD.sub("-", text.strip())[:128]
    return name if name[:1].isalnum() else ("j" + name)[:128]


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

    explicit = env.get("TRAINGUARD_JOB", "").strip()
    if explicit:
        return named(explicit, "TRAINGUARD_JOB", wire_name(explicit))
    slurm_job = env.get("SLURM_JOB_ID", "").strip()
    if slurm_job:
        step = env.get("SLURM_STEP_ID", "").strip()
        # 0xFFFFFFF0 and above are the batch, extern and interactive steps, not srun's
        if step.isdigit() and int(step) < 0xFFFFFFF0:
            slurm_job = f"{slurm_job}.{step}"
        return named(slurm_job, "slurm")
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id.lower() not in _DEFAULT_RUN_IDS:
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
        parent = os.getppid() if ppid is None else ppid
        basis, source = f"launcher {host} {parent} {_start_ticks(parent)}", "launcher_process"
    else:
        own = os.getpid() if pid is None else pid
        basis, source = f"process {host} {own} {_start_ticks(own)}", "process"
    job = f"{script}-{hashlib.sha1(f'{script} {basis}'.encode()).hexdigest()[:12]}"
    return named(job, source, job)


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


# --- capabilities: is this rank under NVRx's in-process Wrapper? ----------------------

_WRAP_MODULE = "nvidia_resiliency_ext.inprocess.wrap"


def under_wrapper(frame: FrameType | None = None) -> bool:
    """Whether NVRx's inprocess.Wrapper is running the code of `frame` (default: the
    caller's): a `CallWrapper.__call__` frame of nvidia_resiliency_ext.inprocess.wrap on
    its stack. Every wrapped call runs there, from NVRx 0.4.1 to 0.7 (0.6 deprecated the
    Wrapper but kept it). Nothing is imported: without NVRx loaded the answer is False."""
    if _WRAP_MODULE not in sys.modules:
        return False
    f: FrameType | None = sys._getframe(1) if frame is None else frame
    while f is not None:
        code = f.f_code
        if (
            code.co_qualname == "CallWrapper.__call__"
            and f.f_globals.get("__name__") == _WRAP_MODULE
        ):
            return True
        f = f.f_back
    return False


# --- uncaught exceptions and the exit code --------------------------------------------

_hooks_installed = False
_reported_ids: deque[int] = deque(maxlen=64)  # exceptions that take no attribute


def _first_report(exc: BaseException) -> bool:
    """True the first time an exception object is seen (no reference to it is kept: its
    frames hold the training state, gloo's context among them)."""
    try:
        if getattr(exc, "_trainguard_reported", False):
            return False
        exc._trainguard_reported = True  # type: ignore[attr-defined]
        return True
    except Exception:
        if id(exc) in _reported_ids:
            return False
        _reported_ids.append(id(exc))
        return True


def _exit_code(status: object) -> int:
    """The process exit code SystemExit(status) gives."""
    if status is None:
        return 0
    if isinstance(status, int):
        return status & 0xFF
    return 1


def _install_hooks() -> None:
    """Route uncaught exceptions and sys.exit() to the current session, once per process;
    the hooks in place before still run after ours."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    previous_hook, previous_thread_hook, real_exit = sys.excepthook, threading.excepthook, sys.exit

    def live() -> Session | None:
        s = _current
        return s if s is not None and not s._closed.is_set() else None

    def excepthook(tp: type[BaseException], value: BaseException, tb: Any) -> None:
        with contextlib.suppress(Exception):
            if (s := live()) is not None:
                s._uncaught(value, None)
        previous_hook(tp, value, tb)

    def thread_excepthook(args: Any) -> None:
        with contextlib.suppress(Exception):
            if (s := live()) is not None and args.exc_value is not None:
                s._uncaught(args.exc_value, args.thread)
        previous_thread_hook(args)

    def recording_exit(status: object = None) -> None:
        if (s := live()) is not None and threading.current_thread() is threading.main_thread():
            s.exit_code = _exit_code(status)
        real_exit(status)  # type: ignore[arg-type]

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
    sys.exit = recording_exit  # type: ignore[assignment]


class _Compute:
    """Context manager adding a section's duration to the current step's compute time."""

    __slots__ = ("_s", "_t0")

    def __init__(self, session: Session) -> None:
        self._s = session
        self._t0 = 0.0

    def __enter__(self) -> _Compute:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        s = self._s
        s._compute = (s._compute or 0.0) + (time.perf_counter() - self._t0)


class _Step:
    """Context manager for one step; a class (not a generator) to keep it to a few µs."""

    __slots__ = ("_n", "_s", "_t0")

    def __init__(self, session: Session) -> None:
        self._s = session
        self._n = 0
        self._t0 = 0.0

    def __call__(self, n: int) -> _Step:
        self._n = n
        return self

    def __enter__(self) -> _Step:
        s = self._s
        if s._restart_pending:
            s._raise_restart()
        s._in_step = True
        s._compute = None
        self._t0 = time.time()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        s = self._s
        s._in_step = False
        if exc_type is None:
            s.step_done(self._n, self._t0, time.time(), s._compute)
        elif not issubclass(exc_type, RestartRequested):
            s._step_failed(exc)


class Session:
    """One training process attached to the node agent."""

    def __init__(
        self,
        job: str,
        rank: int,
        local_rank: int,
        world_size: int,
        attempt: int,
        socket_path: str | None,
        heartbeat_interval: float = 1.0,
        signal_after: float = 2.0,
        install_signal_handler: bool = True,
        flush_interval: float = FLUSH_INTERVAL_S,
        *,
        display_name: str | None = None,
        launcher: str = "none",
        in_process: bool | None = None,
        discover: bool = False,
    ) -> None:
        """`socket_path` None: no agent known yet; with `discover`, the heartbeat thread
        looks for one in the well-known places. `in_process` None: detected (see
        under_wrapper) at attach, at every heartbeat and in restart_iteration."""
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, not {launcher!r}")
        self.job = job
        self.display_name = display_name or job
        self.launcher = launcher
        self.in_process = bool(in_process) or (
            in_process is None and under_wrapper(sys._getframe())
        )
        self._detect_wrapper = in_process is None
        self.exit_code: int | None = None  # as sys.exit() or a SystemExit out of a step said
        self.uncaught: str | None = None  # the type of an exception nothing caught
        self._discover = discover
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.attempt = attempt
        self.iteration = 0
        self.pid = os.getpid()
        self.socket_path = socket_path
        self.heartbeat_interval = heartbeat_interval
        self.signal_after = signal_after
        self.sent = 0
        self.dropped = 0
        self.last_step: int | None = None
        self.restart_requests = 0
        self._restart_pending = False
        self._restart_reason = ""
        self._restart_id = ""
        self._in_step = False
        self._closed = threading.Event()
        self._forked = False
        # Steps are queued by the hook (an append, no system call) and sent by the
        # heartbeat thread every flush_interval, or at once when the hook sets _kick:
        # for a step ending at or after _flush_due (a flush interval after the last
        # send; 0 for the first step of a generation).
        # (step, start, end) or (step, start, end, compute seconds)
        self._steps: deque[tuple[float, ...]] = deque()
        self._compute: float | None = None
        self.flush_interval = min(flush_interval, heartbeat_interval)
        self._flush_due = 0.0
        self._kick = threading.Event()
        self.max_pending_steps = 100_000
        self._flush_lock = threading.Lock()
        self._main_ident = threading.main_thread().ident
        self._owner_ident = threading.get_ident()  # the thread that trains (attached)
        self._stepper = _Step(self)
        self._compute_cm = _Compute(self)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        # An abstract address (Linux): nothing to clean up, unique per process.
        self._sock.bind(f"\0trainguard-sdk-{self.pid}-{id(self):x}")
        self._sock.settimeout(0.5)
        self._signal_installed = False
        if install_signal_handler and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, self._on_signal)
            self._signal_installed = True
        self._send(self._identity("hello"))
        self._listener = threading.Thread(target=self._listen, name="tg-sdk-listen", daemon=True)
        self._listener.start()
        self._heart = threading.Thread(target=self._beat, name="tg-sdk-heartbeat", daemon=True)
        self._heart.start()
        atexit.register(self.close)
        _install_hooks()
        # A forked child (NVRx's monitor process, data loader workers) is not this rank:
        # it must not report, and its exit must not say "bye" for the rank.
        os.register_at_fork(after_in_child=self._after_fork)

    # --- sending ----------------------------------------------------------------------

    def _send_bytes(self, data: bytes) -> None:
        if self._forked:
            return
        if self.socket_path is None:  # no agent found (yet)
            self.dropped += 1
            return
        try:
            self._sock.sendto(data, socket.MSG_DONTWAIT, self.socket_path)
            self.sent += 1
        except OSError:  # no agent, agent gone, or its buffer full: drop and count
            self.dropped += 1

    def _send(self, msg: dict[str, Any]) -> None:
        self._send_bytes(json.dumps(msg, separators=(",", ":")).encode())

    def _identity(self, kind: str) -> dict[str, Any]:
        return {
            "t": kind,
            "job": self.job,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "attempt": self.attempt,
            "iteration": self.iteration,
            "pid": self.pid,
            "ppid": os.getppid(),
            "last_step": self.last_step,
            "dropped": self.dropped,
            "display_name": self.display_name,
            "launcher": self.launcher,
            "in_process": self.in_process,
            "ts": time.time(),
        }

    # --- the step hook ----------------------------------------------------------------

    def step(self, n: int) -> _Step:
        """`with session.step(n):` around one training step (reuses one object)."""
        return self._stepper(n)

    def step_done(self, n: int, start: float, end: float, compute: float | None = None) -> None:
        """Report a completed step (epoch seconds; `compute`: seconds of this rank's own
        work in it, see `compute()`); raises RestartRequested when one is due."""
        self.last_step = n
        steps = self._steps
        if len(steps) >= self.max_pending_steps:  # the flusher is stuck: drop, count
            self.dropped += 1
        elif compute is None:
            steps.append((n, start, end))
        else:
            steps.append((n, start, end, compute))
        if end >= self._flush_due:
            self._flush_due = math.inf  # one kick; the send sets the next due time
            self._kick.set()
        if self._restart_pending:
            self._raise_restart()

    def compute(self) -> _Compute:
        """Mark the rank's own work inside a step, e.g. forward + backward but not the
        gradient all-reduce: `with tg.step(n): with tg.compute(): loss = fwd_bwd(batch)`.
        In synchronous training every rank's wall-clock step waits for the slowest rank,
        so straggler scores need this part. Sections of one step add up. (On a GPU,
        synchronise the stream before the section ends, or it times only the launches.)"""
        return self._compute_cm

    def check_restart(self) -> None:
        """Raise RestartRequested if the agent asked for a restart (for custom loops)."""
        if self._restart_pending:
            self._raise_restart()

    def _raise_restart(self) -> None:
        self._restart_pending = False
        self._flush_due = 0.0  # the re-entry's first step goes at once
        self._send({"t": "restart_raised", "id": self._restart_id, "ts": time.time()})
        raise RestartRequested(self._restart_reason or "restart requested by trainguard")

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Raise only inside a step: anywhere else (NVRx's own restart code, the checkpoint
        # writer) the flag stays set and the next step boundary raises.
        if self._restart_pending and self._in_step:
            self._in_step = False
            self._raise_restart()

    # --- reports ----------------------------------------------------------------------

    def report_exception(
        self,
        exc: BaseException,
        max_lines: int = 12,
        *,
        uncaught: bool = False,
        thread: str | None = None,
    ) -> None:
        """Report an exception (type, message, the traceback's last lines), once per
        exception object: the step that it left, the caller's own handler and the
        uncaught-exception hooks may all see the same one."""
        if not _first_report(exc):
            return
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        text = "".join(lines)
        head = "\n".join(text.splitlines()[-max_lines:])
        msg: dict[str, Any] = {
            "t": "exception",
            "type": type(exc).__name__,
            "message": str(exc)[:1000],
            "traceback": head[-3000:],
            "step": self.last_step,
            "ts": time.time(),
        }
        if uncaught:
            msg["uncaught"] = True
        if thread is not None:
            msg["thread"] = thread[:200]
        self._send(msg)

    def _step_failed(self, exc: BaseException) -> None:
        """An exception left a step (not RestartRequested): an Exception is reported at
        once, a SystemExit keeps its exit code for the goodbye. Others (KeyboardInterrupt,
        NVRx's RankShouldRestart: a peer failed) are no fault of this rank's."""
        if isinstance(exc, Exception):
            self.report_exception(exc)
        elif isinstance(exc, SystemExit):
            self.exit_code = _exit_code(exc.code)

    def _uncaught(self, exc: BaseException, thread: threading.Thread | None) -> None:
        """From the exception hooks: nothing caught `exc` (in `thread`, None: the main
        thread, whose exception ends the process)."""
        self.uncaught = type(exc).__name__
        if not isinstance(exc, KeyboardInterrupt):  # an operator's Ctrl-C is no fault
            name = None if thread is None else thread.name
            self.report_exception(exc, uncaught=True, thread=name)

    def report_interrupted(self, reason: str = "") -> None:
        """The training function is being torn down for a restart it did not cause (e.g.
        NVRx's RankShouldRestart): the agent stops hang checks until the rank re-enters."""
        self._send(
            {"t": "interrupted", "reason": reason[:500], "step": self.last_step, "ts": time.time()}
        )

    @contextlib.contextmanager
    def checkpoint(self, phase: str, step: int | None = None) -> Iterator[None]:
        """`with session.checkpoint("save", step):` measures the blocking time of a
        checkpoint save (or "restore") and reports its start and end."""
        t0 = time.time()
        self._send({"t": "checkpoint", "phase": f"{phase}_start", "step": step, "ts": t0})
        ok = False
        try:
            yield
            ok = True
        finally:
            t1 = time.time()
            self._send(
                {
                    "t": "checkpoint",
                    "phase": f"{phase}_end",
                    "step": step,
                    "ts": t1,
                    "blocking_s": round(t1 - t0, 6),
                    "ok": ok,
                }
            )

    def restart_iteration(
        self, iteration: int, rank: int | None = None, world_size: int | None = None
    ) -> None:
        """Report the Wrapper's restart iteration (and the rank it now has). A restart
        that happened clears a pending request: it has been served."""
        if iteration != self.iteration:
            self._restart_pending = False
        if self._detect_wrapper and not self.in_process:
            self.in_process = under_wrapper(sys._getframe())
        self.iteration = iteration
        if rank is not None:
            self.rank = rank
        if world_size is not None:
            self.world_size = world_size
        with self._flush_lock:  # the old iteration's queued steps go first
            self._drain_steps()
            self._send(self._identity("iteration"))
            self._flush_due = 0.0  # the new iteration's first step goes at once

    def finished(self) -> None:
        """No more steps will come (the agent stops watching this rank for hangs)."""
        self._send({"t": "finished", "step": self.last_step, "ts": time.time()})

    def inject_xid(self, gpu_index: int, code: int, message: str = "") -> None:
        """Ask the agent to inject a simulated XID (fault injection on simulated GPUs)."""
        self._send(
            {
                "t": "inject_xid",
                "gpu": gpu_index,
                "xid": code,
                "message": message,
                "ts": time.time(),
            }
        )

    def log(self, message: str, **data: Any) -> None:
        self._send({"t": "log", "message": message[:2000], "data": data, "ts": time.time()})

    # --- background threads -----------------------------------------------------------

    def _beat(self) -> None:
        """Send the queued steps every flush_interval (and when the hook kicks), the
        identity every heartbeat_interval; both on one clock, so when they coincide the
        agent gets the two datagrams back to back."""
        now = time.monotonic()
        next_flush = now + self.flush_interval
        next_beat = now + self.heartbeat_interval
        while True:
            kicked = self._kick.wait(max(0.0, min(next_flush, next_beat) - time.monotonic()))
            if self._closed.is_set():
                break
            if kicked:
                self._kick.clear()
                self._flush_steps()
                continue
            now = time.monotonic()
            if now >= next_flush:
                self._flush_steps()
                next_flush = _next_tick(next_flush, self.flush_interval, now)
            if now >= next_beat:
                self._heartbeat()
                next_beat = _next_tick(next_beat, self.heartbeat_interval, now)
        self._flush_steps()

    def _heartbeat(self) -> None:
        if self._detect_wrapper and not self.in_process and _WRAP_MODULE in sys.modules:
            frame = sys._current_frames().get(self._owner_ident)
            self.in_process = frame is not None and under_wrapper(frame)
            del frame
        before = self.dropped
        self._send(self._identity("heartbeat"))
        if self._discover and self.dropped != before:
            # no agent yet, or it went away: an agent may listen in another well-known place
            path, _ = _listening_candidate(os.environ)
            if path is not None and path != self.socket_path:
                self.socket_path = path
                self._send(self._identity("hello"))

    def flush(self) -> None:
        """Send the steps queued so far now (the heartbeat thread does it every
        flush_interval, and at once for a step that starts a generation or ends a flush
        interval after the last send; close() does it too)."""
        self._flush_steps()

    def _flush_steps(self) -> None:
        with self._flush_lock:
            self._drain_steps()

    def _drain_steps(self) -> None:
        """Send the queued steps, up to 1,000 per datagram (off the training thread).
        A lost datagram counts each of its steps as dropped. Callers hold _flush_lock, so
        steps and a new iteration reach the agent in the order they happened."""
        steps = self._steps
        if not steps:
            return
        while steps:
            chunk: list[tuple[float, ...]] = []
            while steps and len(chunk) < 1000:
                chunk.append(steps.popleft())
            body = ",".join(
                ("[%d,%.6f,%.6f]" if len(c) == 3 else "[%d,%.6f,%.6f,%.6f]") % c for c in chunk
            )
            if self._forked:
                return
            before = self.dropped
            self._send_bytes(b'{"t":"steps","v":[' + body.encode() + b"]}")
            if self.dropped != before:
                self.dropped += len(chunk) - 1
        self._flush_due = time.time() + self.flush_interval

    def _listen(self) -> None:
        while not self._closed.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                msg = json.loads(data)
            except ValueError:
                continue
            if msg.get("t") == "restart" and msg.get("job") in (None, self.job):
                self._request_restart(str(msg.get("id", "")), str(msg.get("reason", "")))

    def _request_restart(self, request_id: str, reason: str) -> None:
        self.restart_requests += 1
        self._restart_id = request_id
        self._restart_reason = reason
        self._restart_pending = True
        self._send({"t": "restart_received", "id": request_id, "ts": time.time()})
        if self._signal_installed and self._main_ident is not None:
            threading.Thread(target=self._signal_if_stuck, name="tg-sdk-nudge", daemon=True).start()

    def _signal_if_stuck(self) -> None:
        """A rank that does not reach a step boundary within signal_after gets SIGUSR1."""
        deadline = time.monotonic() + self.signal_after
        while self._restart_pending and not self._closed.is_set():
            if time.monotonic() >= deadline:
                if self._in_step and self._main_ident is not None:
                    signal.pthread_kill(self._main_ident, signal.SIGUSR1)
                return
            time.sleep(0.01)

    def _after_fork(self) -> None:
        self._forked = True
        self._closed.set()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._kick.set()  # the heartbeat thread ends
        self._flush_steps()
        bye = self._identity("bye")
        # Clean only as far as the SDK knows: the agent also reads the exit status
        bye["clean"] = self.uncaught is None and self.exit_code in (None, 0)
        if self.uncaught is not None:
            bye["uncaught"] = self.uncaught
        if self.exit_code is not None:
            bye["exit_code"] = self.exit_code
        self._send(bye)
        with contextlib.suppress(OSError):
            self._sock.close()


def _next_tick(t: float, interval: float, now: float) -> float:
    """The next tick of a fixed-rate clock; after a stall (suspended, starved) it
    restarts from now instead of catching up in a burst."""
    t += interval
    return t if t > now else now + interval


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
    (launcher_from_env), the socket (TRAINGUARD_AGENT_SOCKET, else the well-known ones).
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
    local = local_rank if local_rank is not None else _env_int("LOCAL_RANK", 0)
    found: str | None = socket_path
    if socket_path:
        why = probe_socket(socket_path)
        problem = f"{socket_path}: {why}" if why else ""
    else:
        found, problem = find_socket()
    _current = Session(
        job=ident.job,
        rank=rank if rank is not None else _env_int("RANK", 0),
        local_rank=local,
        world_size=world_size if world_size is not None else _env_int("WORLD_SIZE", 1),
        attempt=attempt if attempt is not None else _env_int("TORCHELASTIC_RESTART_COUNT", 0),
        socket_path=found,
        heartbeat_interval=heartbeat_interval,
        signal_after=signal_after,
        install_signal_handler=install_signal_handler,
        flush_interval=flush_interval,
        display_name=ident.display_name,
        launcher=launcher or ident.launcher,
        in_process=in_process,
        discover=not socket_path and not os.environ.get(SOCKET_ENV, "").strip(),
    )
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
