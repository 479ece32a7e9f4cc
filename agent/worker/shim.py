"""The worker shim: `trainguard-worker SCRIPT ARGS` (or `python -m trainguard.worker ...`).

The launcher (torchrun, ft_launcher) starts the shim where it would start
`python SCRIPT ARGS`. The shim finds the node's warm pool (`find_pool`), sends it a `run`
request (argv, environment, working directory, its parent's pid, which Python it is)
with its file descriptors 0, 1 and 2 attached (SCM_RIGHTS), and a warm interpreter
answers with its pid. From then on the shim is the worker as the launcher sees it:
every catchable termination signal it gets is relayed to the worker's process group,
and when the worker ends the pool sends its status, which the shim makes its own (an
exit code is returned, a signal is raised again on the shim itself). If the shim dies,
even by SIGKILL, its end of the socket closes and the worker kills its process group.

No pool (no agent, an agent without `--pool`, a pool that is gone), a busy pool (every
warm interpreter taken) or a pool that cannot run this worker (another Python, other
interpreter flags): the shim says so in one line on stderr and runs the script itself,
as `python SCRIPT ARGS` would. It imports the standard library only (not msgspec, 15 ms):
it writes and reads the pool's messages (trainguard.protocol.pool) as plain JSON, and
tests/agent/test_worker_pool.py holds the two to the same shapes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import Mapping
from types import FrameType
from typing import Any, NoReturn

from trainguard.protocol import discovery
from trainguard.worker import OFF, POOL_ENV, ignore_pynvml_deprecation, pool_path_for

# The first answer of the pool: a live pool answers in microseconds; this bounds a stuck one.
ANSWER_TIMEOUT_S = 2.0
MAX_MESSAGE = 1 << 20
# Relayed to the worker; SIGKILL and SIGSTOP cannot be caught (a SIGKILLed shim takes
# the worker with it through the socket; a stopped shim leaves the worker running).
RELAYED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
    signal.SIGWINCH,
    signal.SIGALRM,
)


def note(message: str) -> None:
    print(f"trainguard-worker: {message}", file=sys.stderr, flush=True)


def interpreter() -> dict[str, Any]:
    """What a warm interpreter must share with this one to stand in for it."""
    f = sys.flags
    return {
        "prefix": sys.prefix,
        "executable": os.path.realpath(sys.executable),
        "version": sys.hexversion,
        "flags": [
            f.optimize,
            f.dev_mode,
            f.isolated,
            f.no_site,
            f.ignore_environment,
            f.hash_randomization,
            getattr(f, "safe_path", False),
            f.utf8_mode,
        ],
        "hashseed": os.environ.get("PYTHONHASHSEED", ""),
    }


def find_pool(env: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """The pool's socket, and why there is none ('' when none is wanted: POOL_ENV off).
    TRAINGUARD_WORKER_POOL names it; else it sits beside the agent's socket, found as the
    SDK finds it (TRAINGUARD_AGENT_SOCKET, else the well-known places)."""
    env = os.environ if env is None else env
    explicit = env.get(POOL_ENV, "").strip()
    if explicit.lower() in OFF:
        return None, ""
    if explicit:
        return explicit, ""
    agent, why = discovery.find_socket(env)
    if agent is None:
        return None, f"no node agent ({why})"
    return pool_path_for(agent), ""


class Relay:
    """Signal handlers that pass each relayed signal on to the worker (its process
    group: the worker leads one, as torchrun's workers do), or hold it until the worker
    is known."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.pending: list[int] = []
        self.previous: dict[int, Any] = {}

    def install(self) -> None:
        for s in RELAYED:
            self.previous[s] = signal.signal(s, self._handle)

    def restore(self) -> None:
        for s, h in self.previous.items():
            signal.signal(s, h)
        self.previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.pid is None:
            self.pending.append(signum)
        else:
            send_to(self.pid, signum)

    def adopt(self, pid: int) -> None:
        self.pid = pid
        for s in self.pending:
            send_to(pid, s)
        self.pending.clear()


def send_to(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)  # not (yet) a group leader


def run_request(args: list[str], fds: list[int]) -> dict[str, Any]:
    """The `run` request (trainguard.protocol.pool.Run) for `args`, with the fds sent."""
    return {
        "t": "run",
        "argv": args,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "ppid": os.getppid(),
        "python": interpreter(),
        "unbuffered": bool(getattr(sys.stdout, "write_through", False)),
        "fds": fds,
    }


def _recv(sock: socket.socket) -> dict[str, Any] | None:
    data = sock.recv(MAX_MESSAGE)
    if not data:
        return None
    msg = json.loads(data)
    return msg if isinstance(msg, dict) else None


Status = tuple[str, int]  # ("code", n) or ("signal", n)


def run_warm(path: str, args: list[str]) -> tuple[Status | None, str]:
    """Run `args` in a warm interpreter of the pool at `path`: (how the worker ended, or
    None to run cold; why cold)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    relay = Relay()
    try:
        sock.settimeout(ANSWER_TIMEOUT_S)
        try:
            sock.connect(path)
        except FileNotFoundError:
            return None, f"no warm pool at {path}"
        except OSError as exc:
            return None, f"no warm pool at {path} ({exc.strerror or exc})"
        fds = [fd for fd in (0, 1, 2) if _is_open(fd)]
        relay.install()  # from here a SIGTERM is not lost: it waits for the worker
        try:
            socket.send_fds(sock, [json.dumps(run_request(args, fds)).encode()], fds)
            answer = _recv(sock)
        except TimeoutError:
            return None, f"the warm pool at {path} did not answer in {ANSWER_TIMEOUT_S} s"
        except (OSError, ValueError) as exc:
            return None, f"the warm pool at {path} failed ({exc})"
        if answer is None or answer.get("t") != "started":
            why = (answer or {}).get("why") or "closed the connection"
            return None, f"the warm pool at {path} {why}"
        pid = int(answer["pid"])
        sock.settimeout(None)
        sock.send(b'{"t": "go"}')  # committed: from now on the worker runs there
        relay.adopt(pid)
        while True:
            try:
                msg = _recv(sock)
            except (OSError, ValueError):
                msg = None
            if msg is None:
                note(f"the warm pool ended without the worker's status (pid {pid}); exit 1")
                return ("code", 1), ""
            if msg.get("t") == "exit":
                if msg.get("signal"):
                    return ("signal", int(msg["signal"])), ""
                return ("code", int(msg.get("code", 1))), ""
    finally:
        relay.restore()
        sock.close()
        if relay.pid is None:  # running cold: a signal that came meanwhile is ours
            for s in relay.pending:
                os.kill(os.getpid(), s)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def exit_like(status: Status) -> NoReturn:
    """Exit as the worker did: with its code, or by its signal raised on ourselves (a
    signal that does not end the shim: 128 + n, as a shell reports it)."""
    kind, n = status
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    if kind == "signal":
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have none
            signal.signal(n, signal.SIG_DFL)
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [n])
            os.kill(os.getpid(), n)
        os._exit(128 + n)
    os._exit(n & 0xFF)


def run_cold(args: list[str]) -> NoReturn:
    """`python SCRIPT ARGS` in this process (`-m MODULE ARGS` for a module)."""
    import runpy

    ignore_pynvml_deprecation()  # as in a warm worker (the pool's filter)

    if args[0] == "-m" and len(args) > 1:
        sys.argv = [args[1], *args[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
        runpy.run_path(args[0], run_name="__main__")
    sys.exit(0)


USAGE = "usage: trainguard-worker SCRIPT [ARGS...] | trainguard-worker -m MODULE [ARGS...]"


def main(argv: list[str] | None = None) -> NoReturn:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args == ["-m"]:
        print(USAGE, file=sys.stderr if not args else sys.stdout)
        sys.exit(2 if not args else 0)
    path, why = find_pool()
    if path is not None:
        status, why = run_warm(path, args)
        if status is not None:
            exit_like(status)
    if why:
        note(f"{why}; running {args[1] if args[0] == '-m' else args[0]} cold")
    run_cold(args)
