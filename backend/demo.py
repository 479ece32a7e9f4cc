"""`trainguard demo`: the whole system on one laptop.

Backend on SQLite, simulated agents (one per simulated node) and, when the `train` extra is
installed, the demo training job with seeded faults. Every part is a real process talking
real HTTP; only the GPUs are simulated. Ctrl-C stops everything.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.error import URLError
from urllib.request import urlopen


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agent.cli", *args]


def wait_ready(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}")
        try:
            with urlopen(f"{url}/readyz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server at {url} not ready after {timeout:.0f} s")


def start_server(
    port: int, env: dict[str, str], stdout: Any = subprocess.DEVNULL, host: str = "127.0.0.1"
) -> subprocess.Popen[bytes]:
    """A `trainguard server` process, returned once /readyz answers."""
    proc = subprocess.Popen(
        _cli("server", "--host", host, "--port", str(port), "--log-level", "warning"),
        env=env,
        stdout=stdout,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_ready(f"http://{host}:{port}", proc=proc)
    except RuntimeError:
        proc.kill()
        raise
    return proc


def run_demo(host: str, port: int, data_dir: Path, nodes: int, gpus: int, with_job: bool) -> int:
    data_dir = data_dir.resolve()
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    token = secrets.token_urlsafe(24)
    url = f"http://{host}:{port}"
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "TRAINGUARD_DEMO": "1",
        "TRAINGUARD_ADMIN_TOKEN": token,
        "TRAINGUARD_DATA_DIR": str(data_dir),
    }
    env.pop("TRAINGUARD_DATABASE_URL", None)
    procs: list[subprocess.Popen[bytes]] = []
    log = (data_dir / "server.log").open("wb")
    try:
        server = subprocess.Popen(
            _cli("server", "--host", host, "--port", str(port), "--log-level", "warning"),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        procs.append(server)
        try:
            wait_ready(url, proc=server)
        except RuntimeError as exc:
            print(f"trainguard demo: {exc}; see {data_dir / 'server.log'}", file=sys.stderr)
            return 1
        sockets = []
        store_port = _store_port() if with_job else None
        for i in range(nodes):
            name = f"demo-node-{i}"
            sock = data_dir / f"{name}.sock"
            sockets.append(str(sock))
            agent_env = {
                **env,
                "TRAINGUARD_AGENT_SPOOL_DIR": str(data_dir / "spool" / name),
                "TRAINGUARD_AGENT_SOCKET_PATH": str(sock),
            }
            if i == 0 and store_port:
                agent_env["TRAINGUARD_AGENT_STORE_PORT"] = str(store_port)
            procs.append(
                subprocess.Popen(
                    _cli(
                        "agent",
                        "--server",
                        url,
                        "--token",
                        token,
                        "--node",
                        name,
                        "--simulate",
                        str(gpus),
                    ),
                    env=agent_env,
                    stdout=(data_dir / f"{name}.log").open("wb"),
                    stderr=subprocess.STDOUT,
                )
            )
        job_note = _start_job(with_job, data_dir, store_port, sockets, env, procs)
        print(
            f"\ntrainguard demo running\n"
            f"  dashboard: {url}/   (token: {token})\n"
            f"  API:       {url}/openapi.json\n"
            f"  nodes:     {nodes} simulated x {gpus} simulated GPUs\n"
            f"  job:       {job_note}\n"
            f"  logs:      {data_dir}\n"
            f"Ctrl-C to stop.",
            flush=True,
        )
        core = procs[: nodes + 1]  # the server and the agents
        job_procs = procs[nodes + 1 :]
        run = 1
        while all(p.poll() is None for p in core):
            if job_procs and all(p.poll() is not None for p in job_procs):
                # The job finished (or gave up): start the next run, new seed, so the
                # dashboard keeps showing a live job until Ctrl-C.
                run += 1
                job_procs = _launch_job(data_dir, store_port, sockets, env, run)
                procs.extend(job_procs)
                print(f"trainguard demo: training run {run} started", flush=True)
            time.sleep(0.5)
        print("trainguard demo: a process exited; stopping", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        _stop(procs[: nodes + 1], procs[nodes + 1 :])
        log.close()


def _store_port() -> int | None:
    try:
        from agent import demojob
    except ImportError:
        return None
    return demojob.free_port()


def _start_job(
    with_job: bool,
    data_dir: Path,
    store_port: int | None,
    sockets: list[str],
    env: dict[str, str],
    procs: list[subprocess.Popen[bytes]],
) -> str:
    if not with_job:
        return "none (--no-job)"
    try:
        import nvidia_resiliency_ext  # noqa: F401
        import torch  # noqa: F401

        from agent import demojob  # noqa: F401
    except ImportError as exc:
        return f"not started ({exc}); install the train extra: pip install 'trainguard[train]'"
    started = _launch_job(data_dir, store_port, sockets, env, 1)
    procs.extend(started)
    return (
        f"'demo-1', {len(started)} ft_launchers x 2 ranks, 5 seeded faults (seed 42) after "
        f"step 10, a new run when one ends (logs in {data_dir / 'job-1'})"
    )


def _launch_job(
    data_dir: Path, store_port: int | None, sockets: list[str], env: dict[str, str], run: int
) -> list[subprocess.Popen[bytes]]:
    from agent import demojob

    assert store_port is not None
    return demojob.launch(
        data_dir / f"job-{run}",
        sockets,
        store_port,
        job=f"demo-{run}",
        faults=5,
        fault_seed=41 + run,
        fault_after_step=10,
        env=env,
    )


def _stop(procs: list[subprocess.Popen[bytes]], job: list[subprocess.Popen[bytes]]) -> None:
    """The job first (ft_launcher starts its workers in their own sessions: stopping a
    launcher alone would leave them running), then the agents, then the server."""
    if job:
        from agent import demojob

        demojob.stop(job)
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
