"""A warm interpreter's side: wait for a shim's request, become its worker, run the script.

Forked by the pool (trainguard.worker.pool) with the heavy imports done. Idle, it dies
with the pool (PR_SET_PDEATHSIG) and blocks on its control socket. Handed a shim's
request, it answers `started` with its pid and waits for the shim's `go` (a shim that
gave up meanwhile closes instead, and the interpreter ends unused). Then it becomes the
worker a fresh `python SCRIPT ARGS` would have been:

- a session and process group of its own (torchrun starts its workers as group leaders
  and signals the group; the shim relays to this group);
- the shim's file descriptors 0, 1, 2 and new sys.stdin/stdout/stderr over them
  (line-buffered on a terminal, unbuffered under PYTHONUNBUFFERED, as at start-up);
- the shim's environment (os.environ, so also the C library's), working directory,
  sys.argv and sys.path[0]; PYTHONPATH entries of the pool that the shim lacks leave
  sys.path and the shim's are added; OMP_NUM_THREADS applied to torch;
- fresh random seeds (random, numpy when loaded): a fork copies the pool's state;
- default signal dispositions; no PR_SET_PDEATHSIG any more (an agent restart must not
  kill training): it lives as long as its shim instead. A watchdog thread reads the
  shim's connection; at EOF (the shim is gone, even by SIGKILL) it SIGKILLs the
  worker's process group, as torchrun's SIGKILL of the group would have.

The script runs as `__main__` (runpy.run_path), then the interpreter ends as Python's
own finalisation does: non-daemon threads joined, atexit handlers, streams flushed; an
uncaught exception printed by sys.excepthook (exit 1), an uncaught KeyboardInterrupt by
SIGINT, SystemExit's code as the exit code.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import random
import signal
import socket
import sys
import threading
from typing import Any, NoReturn

from trainguard.protocol import pool as messages

PR_SET_PDEATHSIG = 1
GO_TIMEOUT_S = 10.0


def set_pdeathsig(sig: int) -> bool:
    """prctl(PR_SET_PDEATHSIG, sig): `sig` when the thread that forked us exits."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def idle(ctl: socket.socket, pool_pid: int) -> NoReturn:
    """An idle warm interpreter: wait for a request, then run it (never returns)."""
    set_pdeathsig(signal.SIGKILL)
    if os.getppid() != pool_pid:  # the pool died before prctl
        os._exit(0)
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent's terminal: the pool decides
    try:
        data, fds, _flags, _addr = socket.recv_fds(ctl, 1 << 20, 8)
    except OSError:
        os._exit(0)
    ctl.close()
    if not data or not fds:
        os._exit(0)  # the pool closed us: shutting down
    conn = socket.socket(fileno=fds[0])
    try:
        request = messages.decode_to_pool(data)
    except messages.PoolError:
        os._exit(0)  # the shim's end closes: it runs the script itself
    if not isinstance(request, messages.Run):
        os._exit(0)
    conn.send(messages.encode(messages.Started(pid=os.getpid())))
    conn.settimeout(GO_TIMEOUT_S)
    try:
        go = conn.recv(1024)
    except OSError:
        go = b""
    try:
        messages.decode_go(go)
    except messages.PoolError:  # closed (b""): the shim gave up and runs the script itself
        os._exit(0)
    conn.settimeout(None)
    adopt(request, fds[1:], conn)


def adopt(request: messages.Run, fds: list[int], conn: socket.socket) -> NoReturn:
    os.setsid()
    set_pdeathsig(0)
    # the shim's 0, 1, 2 (the ones it had open) replace ours
    for target, fd in zip(request.fds, fds, strict=False):
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)
    env = dict(request.env)
    pool_pythonpath = os.environ.get("PYTHONPATH", "")
    os.environ.clear()
    os.environ.update(env)
    os.environ["TRAINGUARD_WORKER_PID"] = str(os.getpid())
    os.environ["TRAINGUARD_WORKER_PPID"] = str(request.ppid)
    os.environ["TRAINGUARD_WORKER_SHIM_PID"] = str(_peer_pid(conn))
    _reopen_stdio(env, request.unbuffered)  # `python -u` ran the shim
    os.chdir(request.cwd)
    args = list(request.argv)
    _fix_path(args, pool_pythonpath, env.get("PYTHONPATH", ""))
    _reseed(env)
    for s in range(1, signal.NSIG):
        if s in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    threading.Thread(
        target=_watch_shim, args=(conn,), name="trainguard-worker-watchdog", daemon=True
    ).start()
    _run(args)


def _peer_pid(conn: socket.socket) -> int:
    import struct

    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", creds)[0])
    except OSError:
        return 0


def _watch_shim(conn: socket.socket) -> None:
    """The shim's liveness: its end of the connection closes when it dies."""
    while True:
        try:
            data = conn.recv(1024)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:
            break
    try:
        os.killpg(os.getpgid(0), signal.SIGKILL)
    finally:
        os.kill(os.getpid(), signal.SIGKILL)


def _reopen_stdio(env: dict[str, str], unbuffered_shim: bool = False) -> None:
    unbuffered = bool(env.get("PYTHONUNBUFFERED")) or unbuffered_shim
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        try:
            os.fstat(fd)
        except OSError:
            setattr(sys, name, None)
            continue
        tty = os.isatty(fd)
        raw = io.FileIO(fd, "rb" if mode == "r" else "wb", closefd=False)
        buffered: io.BufferedIOBase
        buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        old = getattr(sys, f"__{name}__", None)
        stream = io.TextIOWrapper(
            buffered,
            encoding=getattr(old, "encoding", None) or "utf-8",
            errors="backslashreplace" if name == "stderr" else None,
            line_buffering=(mode == "w" and (tty or name == "stderr")),
            write_through=(mode == "w" and (unbuffered or name == "stderr")),
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _fix_path(args: list[str], pool_pythonpath: str, job_pythonpath: str) -> None:
    """sys.path as `python SCRIPT` in the shim's environment would have it."""
    drop = {os.path.abspath(p) for p in pool_pythonpath.split(os.pathsep) if p}
    base = [p for p in sys.path[1:] if os.path.abspath(p) not in drop]
    extra = [os.path.abspath(p) for p in job_pythonpath.split(os.pathsep) if p]
    first = os.getcwd() if args[0] == "-m" else os.path.dirname(os.path.abspath(args[0]))
    sys.path[:] = [first, *extra, *(p for p in base if p not in extra)]


def _reseed(env: dict[str, str]) -> None:
    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        with contextlib.suppress(Exception):
            np.random.seed(None)
    torch = sys.modules.get("torch")
    if torch is not None:  # the pool imported torch under OMP_NUM_THREADS=1
        threads = env.get("OMP_NUM_THREADS", "").strip()
        n = int(threads) if threads.isdigit() and int(threads) > 0 else 0
        torch.set_num_threads(n or len(os.sched_getaffinity(0)))


def _run(args: list[str]) -> NoReturn:
    import runpy

    code: int = 0
    interrupted = False
    try:
        if args[0] == "-m" and len(args) > 1:
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        interrupted = True
        sys.excepthook(*sys.exc_info())
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    _finalize()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 128 + signal.SIGINT
    os._exit(code)


def _exit_code(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    with contextlib.suppress(Exception):
        print(value, file=sys.stderr)
    return 1


def _finalize() -> None:
    """What Python does at exit before its C-level teardown (Py_FinalizeEx): join the
    non-daemon threads, run the atexit handlers, flush the standard streams."""
    import atexit

    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        with contextlib.suppress(Exception):
            shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass
