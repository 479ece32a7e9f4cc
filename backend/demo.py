"""`trainguard demo`: the whole system on one laptop.

Backend on SQLite, simulated agents (one per simulated node) and, when the `train` extra is
installed, the demo training job with seeded faults. Every part is a real process talking
real HTTP; only the GPUs are simulated (a GPU that falls off the bus comes back after a
simulated reboot, agent/collectors/simulated.py).

Ctrl-C, SIGTERM or SIGHUP stops everything within 10 s: the demo starts each child in a
session of its own and stops them in order (the job and the agents, then the server), and
as a subreaper it adopts what its descendants daemonize (NVRx's per-rank monitor
processes), so the job's whole process tree is found and ended, SIGKILL after a grace
period.
"""

from __future__ import annotations

import contextlib
import importlib.util
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

from trainguard.backend import demojob
from trainguard.backend.demowatch import BACKOFF_FIRST_S as BACKOFF_FIRST_S  # tests read it
from trainguard.backend.demowatch import Scheduler, StartWatch, relaunch_readmitted, spares

# The demo job: steps of about 0.2 s (the sleep stands for model work on top of the tiny
# MLP's few milliseconds), so a run of 1,500 steps trains for about 5 minutes, and its 5
# seeded faults fall at least 100 steps (20 s of training) apart from step 50 on.
STEPS = 1500
STEP_SLEEP_S = 0.2
FAULTS = 5
FAULT_AFTER_STEP = 50
FAULT_MIN_GAP = 100
# Each simulated node runs this many ranks (demojob.launch), and keeps as many warm
# interpreters in its pool.
RANKS_PER_NODE = 2
# ft_launcher's restart budget per run: room for every fault to cost a launcher restart,
# twice (an escalation), so a run ends by finishing, not by running out of restarts.
MAX_RESTARTS = 2 * FAULTS
# Seconds each stage of a shutdown may take before SIGKILL: the job and the agents (an
# agent takes about 2 s to stop), then the server; 6 s in all, inside the 10 s promised.
STOP_GRACE_S = {"job and agents": 4.0, "server": 2.0}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainguard.agent.cli", *args]


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


class _Stopped(Exception):
    """SIGINT, SIGTERM or SIGHUP arrived: stop everything."""


def _on_signal(signum: int, frame: object) -> None:
    raise _Stopped(signal.Signals(signum).name)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


# The demo's policy over the defaults, scaled to its seeded fault rate:
# - a node whose simulated GPU came back from its simulated reboot (40 s) is readmitted
#   after a minute of health, so the whole cordon -> readmission cycle shows within a few
#   minutes;
# - the escalation ladder counts actions within 2 minutes, not 30: the demo seeds a fault
#   about every minute (5 per run), a rate that under the default window reads as a
#   flapping job: a watch of the demo saw its second run given up (stop_job) on its fifth
#   fault although each earlier one had recovered. Repeated failures of one episode
#   still climb at once (escalation.on_failed).
DEMO_POLICY = """\
[readmission]
readmit_after_s = 60

[escalation]
window_s = 120
"""
# The demo's gloo timeout is also the Wrapper's re-entry wait: 5 s let ranks that
# re-entered more than 5 s apart on busy cores fail twice and fall back to a launcher
# restart (docs/restarts.md, "The demo's 5 s gloo timeout"); the launcher matrix uses 15.
GLOO_TIMEOUT_S = 15
# The spare's launcher starts this long after the others, once their round formed: NVRx
# 0.7's barrier rendezvous never completed with three launchers arriving for --nnodes 2.
SPARE_DELAY_S = 30.0
# Each run's rendezvous port, hosted by its first launcher, kept for a relaunched spare.
# (The first node's agent's store as the rendezvous, `is_host=0`, trained under NVRx
# 0.4.1 but never formed a round under 0.7's barrier rendezvous.)
_RDZV_PORTS: dict[int, int] = {}


def run_demo(
    host: str,
    port: int,
    data_dir: Path,
    nodes: int,
    gpus: int,
    with_job: bool,
    launcher: str | None = None,
) -> int:
    """Run everything until a stop signal; `launcher` None picks the job's launcher by
    what is installed (`job_launcher`)."""
    try:
        launcher, why = _choose(launcher) if with_job else (None, "")
    except ValueError as exc:
        print(f"trainguard demo: {exc}", file=sys.stderr)
        return 2
    data_dir = data_dir.resolve()
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    token = secrets.token_urlsafe(24)
    url = f"http://{host}:{port}"
    policy = data_dir / "policy.toml"
    policy.write_text(DEMO_POLICY)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "TRAINGUARD_DEMO": "1",
        "TRAINGUARD_ADMIN_TOKEN": token,
        "TRAINGUARD_DATA_DIR": str(data_dir),
        "TRAINGUARD_POLICY_FILE": str(policy),
    }
    env.pop("TRAINGUARD_DATABASE_URL", None)
    core: list[subprocess.Popen[bytes]] = []  # the server, then the agents
    job: list[subprocess.Popen[bytes]] = []  # the launchers of every run so far
    log = (data_dir / "server.log").open("wb")
    demojob.become_subreaper()
    previous = {s: signal.signal(s, _on_signal) for s in _STOP_SIGNALS}
    try:
        server = subprocess.Popen(
            _cli("server", "--host", host, "--port", str(port), "--log-level", "warning"),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the demo stops it, after the job and the agents
        )
        core.append(server)
        try:
            wait_ready(url, proc=server)
        except RuntimeError as exc:
            print(f"trainguard demo: {exc}; see {data_dir / 'server.log'}", file=sys.stderr)
            return 1
        sockets = []
        # Without torch there is no job, and no store for agent 0 to host; without NVRx the
        # job runs under torchrun.
        store_port = _store_port() if launcher is not None else None
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
            with (data_dir / f"{name}.log").open("wb") as agent_log:
                core.append(
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
                            # Warm interpreters for its workers: a launcher restart's new
                            # generation is forked from them (agent/worker/).
                            *(["--pool", str(RANKS_PER_NODE)] if store_port else []),
                        ),
                        env=agent_env,
                        stdout=agent_log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        job_note = _start_job(with_job, launcher, why, data_dir, store_port, sockets, env, job)
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
        run, current = 1, list(job)
        starts = StartWatch(url, token)
        scheduler = Scheduler(url, token)
        next_run: float | None = None  # when the next run starts, once the current one ended
        next_reap = next_check = time.monotonic()
        while all(p.poll() is None for p in core):
            if spares(nodes) and time.monotonic() >= next_check and current:
                next_check += 5.0
                names = [f"demo-node-{i}" for i in range(len(current))]

                def relaunch(i: int, run: int = run) -> subprocess.Popen:
                    (back,) = _launch_job(data_dir, store_port, sockets, env, run, launcher, only=i)
                    return back

                for i in relaunch_readmitted(current, names, scheduler.cordoned, relaunch):
                    job.append(current[i])
                    print(
                        f"trainguard demo: {names[i]} readmitted: its launcher runs again, "
                        "as the job's hot spare",
                        flush=True,
                    )
            if current and all(p.poll() is not None for p in current):
                # The job finished (or gave up): start the next run, new seed, so the
                # dashboard keeps showing a live job until Ctrl-C; after runs that never
                # trained, say why and wait before the next (StartWatch).
                if next_run is None:
                    next_run = time.monotonic() + starts.ended(
                        f"demo-{run}", data_dir / f"job-{run}"
                    )
                if time.monotonic() >= next_run:
                    run += 1
                    current = _launch_job(data_dir, store_port, sockets, env, run, launcher)
                    job.extend(current)
                    next_run = None
                    print(f"trainguard demo: training run {run} started", flush=True)
            if time.monotonic() >= next_reap:  # the monitors of ended ranks, adopted
                demojob.reap_adopted({p.pid for p in [*core, *job]})
                next_reap += 5.0
            time.sleep(0.5)
        print("trainguard demo: a process exited; stopping", file=sys.stderr)
        return 1
    except _Stopped:
        return 0
    finally:
        for s in _STOP_SIGNALS:  # a second Ctrl-C does not cut the shutdown short
            signal.signal(s, signal.SIG_IGN)
        try:
            _stop(core, job)
        finally:
            log.close()
            for s, handler in previous.items():
                signal.signal(s, handler)


def _store_port() -> int | None:
    return demojob.free_port()


def job_launcher(python: tuple[int, int] = sys.version_info[:2]) -> tuple[str | None, str]:
    """The launcher the demo job runs under here, and why when it is not ft_launcher:
    ("ft_launcher", "") with NVRx; ("torchrun", why) without it (there is no NVRx wheel
    for Python 3.13: no ft_launcher and no Wrapper); (None, why) without torch. Looked
    up, not imported: importing torch here would cost the demo seconds and print its
    import-time warnings; the job's own processes import it."""
    if importlib.util.find_spec("torch") is None:
        return (
            None,
            "No module named 'torch'; install the train extra: pip install 'trainguard[train]'",
        )
    if importlib.util.find_spec("nvidia_resiliency_ext") is None:
        cause = (
            f"NVRx has no wheel for Python {python[0]}.{python[1]}"
            if python >= (3, 13)
            else "NVRx (nvidia-resiliency-ext) is not installed"
        )
        return "torchrun", (
            f"{cause}: no ft_launcher and no in-process Wrapper, so the job runs under "
            "torchrun, with launcher restarts from the warm pool and no in_process level"
        )
    return "ft_launcher", ""


def _choose(asked: str | None) -> tuple[str | None, str]:
    """The job's launcher and why (`job_launcher`), or the one `--launcher` asked for,
    which must be there: ValueError with the reason otherwise."""
    found, why = job_launcher()
    if asked is None or asked == found:
        return found, why
    if asked == "torchrun" and found is not None:
        return "torchrun", (
            "torchrun asked for (--launcher torchrun): no in-process Wrapper, so launcher "
            "restarts from the warm pool and no in_process level"
        )
    raise ValueError(f"--launcher {asked}: {why}")


def _start_job(
    with_job: bool,
    launcher: str | None,
    why: str,
    data_dir: Path,
    store_port: int | None,
    sockets: list[str],
    env: dict[str, str],
    procs: list[subprocess.Popen[bytes]],
) -> str:
    if not with_job:
        return "none (--no-job)"
    if launcher is None:
        return f"not started ({why})"
    started = _launch_job(data_dir, store_port, sockets, env, 1, launcher)
    procs.extend(started)
    n = len(started)
    spare = (
        f";\n             {n - spares(n)} of the {n} nodes train and the other waits as a hot "
        "spare (the rendezvous picks which): an excluded node leaves the job, the spare "
        "takes its place, and the readmitted node becomes the new spare"
        if spares(n)
        else ""
    )
    how = (
        f"{n} ft_launchers x {RANKS_PER_NODE} ranks under NVRx's Wrapper (from warm pools);\n"
        f"             the {n} launchers imitate {n} nodes on this one host, so they run "
        f"with {demojob.SIMULATED_NODES_ENV}=1,\n"
        "             NVRx's switch for simulations (trainguard never sets it on a real node)"
        if launcher == "ft_launcher"
        else f"{n} torchruns x {RANKS_PER_NODE} ranks (from warm pools);\n             {why}"
    )
    return (
        f"'demo-1', {how};\n"
        f"             steps of {STEP_SLEEP_S:g} s, {FAULTS} seeded faults (seed 42) from step "
        f"{FAULT_AFTER_STEP} on, a new run when one ends (logs in {data_dir / 'job-1'})"
        f"{spare}"
    )


def _launch_job(
    data_dir: Path,
    store_port: int | None,
    sockets: list[str],
    env: dict[str, str],
    run: int,
    launcher: str | None,
    only: int | None = None,
) -> list[subprocess.Popen[bytes]]:
    """The run's launchers (or node `only`'s): all but the spares train, the spares wait
    in the rendezvous (hosted by the first launcher to come up: an exclusion of its node
    ends the run's rendezvous, and the demo starts the next run)."""
    assert store_port is not None and launcher is not None
    return demojob.launch(
        data_dir / f"job-{run}",
        sockets,
        store_port,
        job=f"demo-{run}",
        steps=STEPS,
        step_sleep=STEP_SLEEP_S,
        max_restarts=MAX_RESTARTS,
        faults=FAULTS,
        fault_seed=41 + run,
        fault_after_step=FAULT_AFTER_STEP,
        fault_min_gap=FAULT_MIN_GAP,
        env=env,
        nproc_per_node=RANKS_PER_NODE,
        extra_args=["--gloo-timeout", str(GLOO_TIMEOUT_S)],
        shim=True,
        launcher=launcher,
        nnodes=len(sockets) - spares(len(sockets)),
        rdzv_port=_RDZV_PORTS.setdefault(run, demojob.free_port()),
        only=only,
        spare_delay_s=SPARE_DELAY_S,
    )


def _stop(core: list[subprocess.Popen[bytes]], job: list[subprocess.Popen[bytes]]) -> None:
    """End every process the demo started and every process below them, within about 6 s.

    First the job and the agents together: the launchers, their workers (ft_launcher
    starts them in sessions of their own, so stopping a launcher or its process group alone
    would leave them running), what those daemonized (NVRx's monitor processes, adopted by
    this process, a subreaper) and the agents. Then the server, then whatever is still
    below this process (started while it stopped)."""
    me = os.getpid()
    tree = demojob.process_tree(me)
    server: dict[int, int] = {}
    if core and core[0].pid in tree:
        server = {core[0].pid: tree[core[0].pid], **demojob.process_tree(core[0].pid)}
    stages = {
        "job and agents": {pid: t for pid, t in tree.items() if pid not in server},
        "server": server,
    }
    for stage, procs in stages.items():
        demojob.end_processes(procs, STOP_GRACE_S[stage])
    demojob.end_processes(demojob.process_tree(me), 0.5)  # started during the shutdown
    for p in [*core, *job]:
        with contextlib.suppress(subprocess.TimeoutExpired):  # ended above; collect its status
            p.wait(1.0)
    demojob.reap_adopted(set())
