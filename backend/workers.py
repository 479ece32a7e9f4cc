"""`trainguard server --workers N`: N server processes on one port (SO_REUSEPORT).

One process stores about 110k samples/s on PostgreSQL (docs/benchmarks.md): its one
writer thread waits on its one COPY, and its request path and writer share one GIL.
Several processes on one host each have their own event loop, GIL and writer connection,
so PostgreSQL runs their COPYs side by side. They share the database exactly as the
replicas of a deployment do: a replayed batch is stored once whichever process gets it
(the unique batch key, backend/ingest/statements.py), the decision engine runs on the one
process that holds the advisory lock (backend/engine/leader.py), and live updates cross
processes through LISTEN/NOTIFY. So several processes need PostgreSQL; SQLite stays one.

The supervisor (this process) binds one listening socket per worker, each with
SO_REUSEPORT, before any worker starts: the kernel spreads new connections over the
sockets evenly by their address hash from the first connection on (a worker still
importing finds its share waiting in its backlog), where one shared socket lets the
first worker to accept take most of a fleet's long-lived connections. A worker that dies
is started again on its socket; SIGTERM or SIGINT stops every worker gracefully (each
drains its ingest and releases the engine lock), then the supervisor exits; a worker
whose supervisor is gone stops too.
"""

from __future__ import annotations

import contextlib
import logging
import logging.config
import multiprocessing as mp
import signal
import socket
import threading
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any, cast

log = logging.getLogger("trainguard.server")

WORKER_HEADER = "x-trainguard-worker"  # which worker answered (0..N-1), with --workers > 1
RESTART_DELAY_S = 1.0
STOP_TIMEOUT_S = 30.0


def listen_backlog() -> int:
    """The accept queue to ask for: as long as the kernel allows (net.core.somaxconn, which
    caps any listen()), at least uvicorn's 2,048. Every agent of a cluster connects within
    one batch interval after a backend restart (16,384 in 8 s in `bench ingest`); a full
    queue drops a connect, which the agent's kernel retries after 1, 3, 7, 15, 31 s. With
    2,048 per process, 16,384 nodes saw 39,444 dropped connects in one run; with 4,096,
    none (docs/benchmarks.md, "The accept queue")."""
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return max(2048, int(f.read()))
    except (OSError, ValueError):  # not Linux: the kernel caps it anyway
        return 2048


def reuseport_socket(host: str, port: int, backlog: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def _worker(
    index: int,
    sock: socket.socket,
    stop: Connection,
    options: dict[str, Any],
    uvicorn_kwargs: dict[str, Any],
) -> None:
    """One worker process: the same app as a single `trainguard server`, on its socket.

    It stops on its own signals (uvicorn's, as a single server does; a service manager's
    SIGTERM to the whole group reaches every worker) or when the supervisor says so on
    `stop`, or is gone (its end of the pipe closed): never signalled twice, which would
    make uvicorn skip its graceful shutdown, and never left behind its supervisor."""
    import uvicorn

    from trainguard.backend.app import Server, create_app, tune_gc
    from trainguard.backend.settings import Settings

    settings = Settings(**options)
    api = create_app(settings)
    if settings.gc_tuning:
        tune_gc()
    config = uvicorn.Config(api, headers=[(WORKER_HEADER, str(index))], **uvicorn_kwargs)
    server = Server(config)

    def watch() -> None:
        told = False
        with contextlib.suppress(EOFError, OSError):
            while not stop.poll(0.1):
                if server.started and not told:
                    stop.send("ready")  # from here on a death is a crash, not a failed start
                    told = True
        server.should_exit = True

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()
    server.run(sockets=[sock])


class Supervisor:
    def __init__(
        self,
        workers: int,
        host: str,
        port: int,
        options: dict[str, Any],
        uvicorn_kwargs: dict[str, Any],
    ) -> None:
        self.workers = workers
        self.options = options
        self.uvicorn_kwargs = uvicorn_kwargs
        self._ctx = mp.get_context("spawn")
        # uvicorn listens again on a socket it is given, with its own backlog: the same one.
        backlog = uvicorn_kwargs.setdefault("backlog", listen_backlog())
        self.sockets = [reuseport_socket(host, port, backlog) for _ in range(workers)]
        self.procs: list[BaseProcess | None] = [None] * workers
        self._ready = [False] * workers
        self._stops: list[Connection | None] = [None] * workers
        self._stopping = False
        self.exit_code = 0

    def _start(self, index: int) -> None:
        # Duplex: "stop" to the worker, "ready" from it once it serves. A worker that dies
        # before it was ready failed to start (a setting, the port, the database): the
        # supervisor then stops, as a single `trainguard server` would, instead of
        # starting it again and again.
        theirs, ours = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_worker,
            args=(index, self.sockets[index], theirs, self.options, self.uvicorn_kwargs),
            name=f"trainguard-worker-{index}",
        )
        proc.start()
        theirs.close()
        previous = self._stops[index]
        if previous is not None:
            previous.close()
        self.procs[index] = proc
        self._stops[index] = ours
        self._ready[index] = False

    def _was_ready(self, index: int) -> bool:
        conn = self._stops[index]
        with contextlib.suppress(EOFError, OSError):
            while conn is not None and not self._ready[index] and conn.poll():
                self._ready[index] = conn.recv() == "ready"
        return self._ready[index]

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True

    def run(self) -> int:
        log_config = self.uvicorn_kwargs.get("log_config")
        if isinstance(log_config, dict):  # the workers' format for the supervisor's lines
            logging.config.dictConfig(log_config)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        for i in range(self.workers):
            self._start(i)
        log.info("trainguard server: %d worker processes on one port", self.workers)
        try:
            while not self._stopping:
                live = {p.sentinel: i for i, p in enumerate(self.procs) if p is not None}
                for sentinel in wait(list(live), timeout=0.5):
                    i = live[cast(int, sentinel)]
                    proc = self.procs[i]
                    code = proc.exitcode if proc is not None else None
                    self.procs[i] = None
                    if self._stopping:
                        continue
                    if not self._was_ready(i):
                        log.error("trainguard worker %d failed to start (code %s)", i, code)
                        self.exit_code = code or 1
                        self._stopping = True
                        break
                    log.warning("trainguard worker %d exited (code %s); starting it again", i, code)
                    time.sleep(RESTART_DELAY_S)
                    if not self._stopping:
                        self._start(i)
        finally:
            self._stop()
        return self.exit_code

    def _stop(self) -> None:
        running = [p for p in self.procs if p is not None and p.is_alive()]
        for conn in self._stops:
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.send("stop")
                    conn.close()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in running:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                log.warning("trainguard worker %s did not stop in time: killed", p.name)
                p.kill()
                p.join(5)
        for s in self.sockets:
            s.close()
