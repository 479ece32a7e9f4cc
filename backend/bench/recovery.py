"""`trainguard bench recovery`: AWS's NVRx experiment on CPU, one run per restart mode.

The demo job (examples/train_demo.py: an MLP on synthetic data, gloo, 4 ranks as two
ft_launchers x 2 ranks, each launcher's ranks reporting to their own agent's LocalServer,
the Wrapper's store hosted outside the ranks) with `faults` seeded faults (examples/faults.py,
the AWS failure simulator's draws: random.Random(seed), after `after_step`, never rank 0).
Every mode gets the same fault steps and ranks; only the kind differs:

- baseline: a plain supervisor loop, as a crash-looping pod would be. The ranks run without
  NVRx's Wrapper and the launchers with `--max-restarts 0`; an exception fault ends its
  rank, its launcher exits non-zero, and the supervisor kills every launcher and worker and
  starts fresh launchers, which resume from the newest complete DCP checkpoint.
- launcher: SIGKILL faults; ft_launcher (min-healthy) restarts the worker group, which
  resumes from the newest complete DCP checkpoint.
- in_process: exception faults; NVRx's Wrapper restarts every rank in its process and the
  ranks continue from memory.
- launcher_warm: as launcher, with each agent running a warm worker pool (agent/worker/,
  2 interpreters per node with torch, DCP and NVRx imported) and ft_launcher starting
  its workers through the shim (`--no-python trainguard-worker`): a new generation is
  forked from the pool instead of importing torch. Run it in the same invocation as
  `launcher` to compare (the result's `warm_vs_cold`).

The mixed plan (`MIXED_KINDS`: the same steps and ranks, the kinds drawn by the same
random.Random(seed) with these weights: for seed 42 SIGKILL, SIGKILL, exception,
exception, hang) compares one fixed reaction to every fault with trainguard choosing:

- mixed_baseline: as baseline (no Wrapper, `--max-restarts 0`, the supervisor relaunches).
- mixed_launcher: always a launcher restart: no Wrapper, so every fault ends its rank (a hang
  through its peers' gloo timeout) and ft_launcher restarts the worker group.
- mixed_nvrx: NVRx by itself, no trainguard: Wrapper and ft_launcher, each reacting to
  the faults it sees (Wrapper: exceptions, and hangs once the peers' gloo timeout raises;
  ft_launcher: a dead rank).
- engine: as mixed_nvrx, plus a real `trainguard server` with its decision engine, the
  agents posting to it over HTTP and carrying out its commands
  (`backend/bench/recovery_engine.py`). An exception fault is reported and waits up to
  `engine_defer_s` for trainguard's restart request before it raises
  (`train_demo.py --fault-defer-s`), so the engine, not the Wrapper, reacts to it.
- engine_after_nvrx: the engine mode without that wait: NVRx reacts first, the engine's
  commands follow (and are acked with the restart NVRx already made).

Measured from what the agents saw (the SDK's step reports and its "injecting fault" log):
recovery per fault = fault -> first step completed after it (started after it), of the
slowest rank; wasted steps = fault step - the step training resumed at; wall time = launch
-> every launcher exited 0; productive time = the time covered by the steps' last
executions, where a step's last execution is the latest generation's run of it (the ranks'
reports of that step that overlap in time: earliest start to latest end), and an instant
two steps' spans share counts once; training efficiency = productive time / wall time,
never above the first step start -> last step end / wall time
(`recovery_analysis.last_executions`, `covered`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

from trainguard.backend.bench.recovery_analysis import (
    analyse,
    fired_faults,
    recovery_phases,
    rendezvous_rounds,
)
from trainguard.backend.bench.recovery_exclusion import EXCLUSION_MODES

MODES = ("baseline", "launcher", "in_process")
FAULT_KIND = {
    "baseline": "exception",
    "launcher": "sigkill",
    "in_process": "exception",
    "launcher_warm": "sigkill",
}
WARM_MODES = ("launcher_warm",)
POOL_SIZE = 2  # warm interpreters per node: one per local rank
# what the result keeps of each node's pool (trainguard.worker.supervisor.PoolProcess.stats)
POOL_KEYS = (
    "size",
    "served",
    "busy_answers",
    "rss_bytes",
    "pss_bytes",
    "template_rss_bytes",
    "cpu_s",
)
MIXED_KINDS = "exception:0.2,hang:0.3,sigkill:0.5"
MIXED_MODES = ("mixed_baseline", "mixed_launcher", "mixed_nvrx", "engine", "engine_after_nvrx")
ALL_MODES = MODES + WARM_MODES + MIXED_MODES + EXCLUSION_MODES
for _m in MIXED_MODES:
    FAULT_KIND[_m] = "mixed"
for _m in EXCLUSION_MODES:
    FAULT_KIND[_m] = "xid"


class _Uplink(TypedDict, total=False):
    """The AgentConfig fields of an agent that posts to a backend."""

    server: str
    token: str


class Nodes:
    """Two imitated nodes: an agent (simulated GPUs) with its LocalServer each, and the
    Wrapper's store host; collects what the agents saw."""

    def __init__(
        self,
        workdir: Path,
        count: int = 2,
        server: str | None = None,
        token: str = "",
        pool: int = 0,
    ) -> None:
        """With `server`, each agent posts to that backend and runs its command executor
        (recovery_engine.ConnectedAgent); without, the bench reads the outboxes itself.
        With `pool`, each agent runs a warm worker pool of that many interpreters, beside
        its socket, and the job starts only once every pool is full."""
        from trainguard.agent.config import AgentConfig
        from trainguard.agent.daemon import build_agent
        from trainguard.agent.executors.storehost import StoreHost
        from trainguard.agent.ranks.server import LocalServer
        from trainguard.backend import demojob

        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.store = StoreHost(port=demojob.free_port())
        self.store.start()
        self.locals: list[Any] = []
        self.agents: list[Any] = []
        self.connected: list[Any] = []
        uplink: _Uplink = {"server": server, "token": token} if server else {}
        for i in range(count):
            cfg = AgentConfig(
                node=f"node{i}",
                simulate=2,
                spool_dir=workdir / f"spool{i}",
                socket_path=workdir / f"agent{i}.sock",
                kmsg_path=None,
                **uplink,
            )
            if server:
                from trainguard.backend.bench.recovery_engine import ConnectedAgent

                conn = ConnectedAgent(cfg)
                self.connected.append(conn)
                self.agents.append(conn.agent)
                self.locals.append(conn.local)
                continue
            agent = build_agent(cfg)
            local = LocalServer(agent)
            local.start()
            self.agents.append(agent)
            self.locals.append(local)
        self.events: list[Any] = []
        self.steps: list[Any] = []
        self.proc_starts: dict[int, float] = {}  # worker pid -> process start (epoch)
        self.entered: dict[int, float] = {}  # worker pid -> training function entered
        self.pools: list[Any] = []
        if pool:
            self._start_pools(pool)

    def _start_pools(self, size: int) -> None:
        from trainguard.worker import pool_path_for
        from trainguard.worker.supervisor import PoolProcess

        for sock in self.sockets:
            p = PoolProcess(pool_path_for(sock), size)
            p.start()
            self.pools.append(p)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            stats = [p.stats() for p in self.pools]
            if all(st is not None and len(st["idle"]) >= size for st in stats):
                return
            if any(p.gave_up for p in self.pools):
                break
            time.sleep(0.2)
        raise RuntimeError(
            "the warm pools did not fill: "
            + "; ".join(str(p.gave_up or p.stats()) for p in self.pools)
        )

    def pool_stats(self) -> list[dict[str, Any] | None]:
        return [p.stats() for p in self.pools]

    @property
    def sockets(self) -> list[str]:
        return [str(loc.socket_path) for loc in self.locals]

    def collect(self) -> Nodes:
        self._note_proc_starts()
        if self.connected:  # what the uplinks drained (and sent) so far
            self.events = [e for c in self.connected for e in list(c.outbox.sent_events)]
            self.steps = [s for c in self.connected for s in list(c.outbox.sent_steps)]
            return self
        for a in self.agents:
            d = a.outbox.drain(10**6, 10**6, 10**6)
            self.events += d.events
            self.steps += d.steps
        return self

    def _note_proc_starts(self) -> None:
        """Each registered worker's process start, on the epoch clock (from its start
        time in clock ticks since boot, read by the agent)."""
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        boot = time.time() - uptime
        tick = os.sysconf("SC_CLK_TCK")
        for loc in self.locals:
            for pid, rec in list(loc.ranks.items()):
                if pid not in self.proc_starts and rec.start_ticks:
                    self.proc_starts[pid] = boot + rec.start_ticks / tick
                if pid not in self.entered and rec.entered_at is not None:
                    self.entered[pid] = rec.entered_at

    def close(self) -> None:
        for p in self.pools:
            p.stop()
        for loc in self.locals:  # any worker a launcher left behind
            for pid, rec in list(loc.ranks.items()):
                if rec.alive:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
        if self.connected:  # each agent stops its own LocalServer and executor
            for c in self.connected:
                c.stop()
        else:
            for loc in self.locals:
                loc.stop()
        self.store.stop()


def logs_tail(workdir: Path, chars: int = 3000) -> str:
    return "\n".join(
        f"--- {f.name}\n{f.read_text(errors='replace')[-chars:]}"
        for f in sorted(workdir.glob("launcher-*.log"))
    )


def supervise(
    nodes: Nodes,
    launch_kw: dict[str, Any],
    *,
    relaunch: bool,
    timeout_s: float,
    max_relaunches: int = 20,
) -> dict[str, Any]:
    """Launch the demo job and wait until every launcher exited 0. With `relaunch`, any
    launcher that exits non-zero makes the supervisor kill the whole job and start it
    afresh (the baseline); otherwise a failed launcher fails the run."""
    from trainguard.backend import demojob

    t0 = time.time()
    procs = demojob.launch(nodes.workdir, nodes.sockets, nodes.store.port, **launch_kw)
    relaunches: list[float] = []
    done = False
    error = None
    try:
        while time.time() - t0 < timeout_s:
            codes = [p.poll() for p in procs]
            if all(c == 0 for c in codes):
                done = True
                break
            if any(c not in (None, 0) for c in codes):
                if not relaunch:
                    error = f"launcher exit codes {codes}"
                    break
                if len(relaunches) >= max_relaunches:
                    error = f"more than {max_relaunches} relaunches"
                    break
                demojob.stop(procs, grace=2.0)  # the whole job goes, as a failed pod set
                relaunches.append(time.time())
                procs = demojob.launch(nodes.workdir, nodes.sockets, nodes.store.port, **launch_kw)
            nodes.collect()
            time.sleep(0.1)
        else:
            error = f"timed out after {timeout_s:.0f} s"
    finally:
        end = time.time()
        demojob.stop(procs, grace=5.0)
        nodes.collect()
    return {"t0": t0, "end": end, "completed": done, "error": error, "relaunches": relaunches}


def fault_plan(mode: str, faults: int, seed: int, after_step: int, steps: int) -> list[Any]:
    """The faults a mode's job run injects (the demo draws the same plan on every rank)."""
    from trainguard.examples import faults as faults_mod

    kinds = MIXED_KINDS if FAULT_KIND[mode] == "mixed" else FAULT_KIND[mode]
    return faults_mod.plan(faults, seed, after_step, steps, 4, faults_mod.parse_kinds(kinds))


def launch_kwargs(mode: str, faults: int, engine_defer_s: float = 3.0) -> dict[str, Any]:
    """The demo job's options that make the mode (see the module docstring)."""
    if mode not in ALL_MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(ALL_MODES)}")
    if mode in EXCLUSION_MODES:
        from trainguard.backend.bench import recovery_exclusion

        return recovery_exclusion.launch_kwargs(mode, faults)
    kw: dict[str, Any] = {
        "fault_kinds": MIXED_KINDS if FAULT_KIND[mode] == "mixed" else FAULT_KIND[mode]
    }
    if mode in ("baseline", "mixed_baseline"):
        kw.update(max_restarts=0, extra_args=["--no-wrapper"])
    elif mode == "mixed_launcher":
        kw.update(max_restarts=faults + 2, extra_args=["--no-wrapper"])
    elif mode in ("launcher", "mixed_nvrx"):
        kw.update(max_restarts=faults + 2)
    elif mode == "launcher_warm":
        kw.update(max_restarts=faults + 2, shim=True)
    elif mode in ("engine", "engine_after_nvrx"):
        # each launcher may restart once for its own rank's death and once for the
        # engine's SIGTERM of its workers
        kw.update(max_restarts=2 * faults + 2)
        if mode == "engine" and engine_defer_s > 0:
            kw.update(extra_args=["--fault-defer-s", str(engine_defer_s)])
    return kw


def run_mode(
    mode: str,
    *,
    faults: int = 5,
    seed: int = 42,
    after_step: int = 10,
    steps: int = 300,
    ckpt_every: int = 20,
    step_sleep: float = 0.02,
    timeout_s: float = 300.0,
    workdir: str | os.PathLike[str] | None = None,
    engine_defer_s: float = 3.0,
    engine_policy: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """One mode, one job run (a fresh work directory: no checkpoints, no fired faults)."""
    if mode in EXCLUSION_MODES:
        from trainguard.backend.bench import recovery_exclusion

        with tempfile.TemporaryDirectory(prefix=f"tg-recovery-{mode}-") as tmp:
            return recovery_exclusion.run_mode(
                mode,
                Path(workdir or tmp) / mode,
                faults=faults,
                seed=seed,
                ckpt_every=ckpt_every,
                step_sleep=step_sleep,
                pool=POOL_SIZE,
                policy=str(engine_policy) if engine_policy else None,
            )
    kw = launch_kwargs(mode, faults, engine_defer_s)
    engine = mode in ("engine", "engine_after_nvrx")
    with tempfile.TemporaryDirectory(prefix=f"tg-recovery-{mode}-") as tmp:
        work = Path(workdir or tmp) / mode
        backend = None
        if engine:
            from trainguard.backend.bench.recovery_engine import Backend

            backend = Backend(work / "server", engine_policy)
        kw.update(
            job="bench",
            steps=steps,
            ckpt_every=ckpt_every,
            faults=faults,
            fault_seed=seed,
            fault_after_step=after_step,
            step_sleep=step_sleep,
        )
        nodes = None
        try:
            pool = POOL_SIZE if mode in WARM_MODES else 0
            nodes = (
                Nodes(work, server=backend.url, token=backend.token)
                if backend
                else Nodes(work, pool=pool)
            )
            relaunch = mode in ("baseline", "mixed_baseline")
            sup = supervise(nodes, kw, relaunch=relaunch, timeout_s=timeout_s)
            incidents = None
            if backend is not None:
                incidents = backend.settle("bench")  # the agents still ack the last restart
                for c in nodes.connected:
                    c.stop()  # their uplinks send what is left
                nodes.collect()
                incidents = backend.incidents("bench")
            pool_stats = nodes.pool_stats()
            out = analyse(nodes, sup["t0"], sup["end"], relaunches=sup["relaunches"])
            logs = [f.read_text(errors="replace") for f in sorted(work.glob("launcher-*.log"))]
            out["phases"] = recovery_phases(nodes, out["per_fault"], rendezvous_rounds(logs))
            if pool_stats:
                out["pool"] = [
                    {k: st.get(k) for k in POOL_KEYS} if st else None for st in pool_stats
                ]
            plan = fault_plan(mode, faults, seed, after_step, steps)
            out.update(
                mode=mode,
                fault_kind=FAULT_KIND[mode],
                plan=[f.describe() for f in plan],
                completed=sup["completed"],
                error=sup["error"],
                relaunches=len(sup["relaunches"]),
                attempts=len({s.attempt for s in nodes.steps}),
                iterations=len({(s.attempt, s.iteration) for s in nodes.steps}),
            )
            if incidents is not None:
                out["engine"] = engine_report(nodes, plan, incidents)
                out["engine"]["defer_s"] = engine_defer_s if mode == "engine" else 0.0
                out["engine"]["policy"] = Path(backend.policy).read_text() if backend else None
                out["engine"]["incidents"] = incidents  # the backend's own record, for review
            if sup["error"]:
                out["log_tail"] = logs_tail(work)
            return out
        finally:
            if nodes is not None:
                nodes.close()
            if backend is not None:
                backend.stop()


def engine_report(nodes: Nodes, plan: list[Any], incidents: list[dict[str, Any]]) -> dict[str, Any]:
    """Per fault: the levels the engine chose and who carried them out (recovery_engine)."""
    from trainguard.backend.bench.recovery_engine import decisions_per_fault, raised_requests

    fired = fired_faults(nodes.events)
    return decisions_per_fault(
        fired, {f.index: f.kind for f in plan}, incidents, raised_requests(nodes.events)
    )


def run(
    modes: tuple[str, ...] | list[str] = MODES,
    faults: int = 5,
    seed: int = 42,
    after_step: int = 10,
    steps: int = 300,
    ckpt_every: int = 20,
    step_sleep: float = 0.02,
    timeout_s: float = 300.0,
    workdir: str | None = None,
    engine_defer_s: float = 3.0,
    engine_policy: str | None = None,
) -> dict[str, Any]:
    """Each mode in its own job run, in order; ratios to the baseline of the same fault
    plan (baseline for the single-kind modes, mixed_baseline for the mixed ones) when it
    ran."""
    import torch

    for mode in modes:
        launch_kwargs(mode, faults)  # an unknown mode fails before any run
    results = {}
    load: dict[str, tuple[float, ...]] = {}
    for mode in modes:
        load[mode] = os.getloadavg()
        results[mode] = run_mode(
            mode,
            faults=faults,
            seed=seed,
            after_step=after_step,
            steps=steps,
            ckpt_every=ckpt_every,
            step_sleep=step_sleep,
            timeout_s=timeout_s,
            workdir=workdir,
            engine_defer_s=engine_defer_s,
            engine_policy=engine_policy,
        )
        results[mode]["load_avg_start"] = load[mode]
    for mode in WARM_MODES:
        warm, cold = results.get(mode), results.get("launcher")
        if warm and cold:
            warm["warm_vs_cold"] = {
                k: (round(warm[k] / cold[k], 3) if warm.get(k) and cold.get(k) else None)
                for k in ("recovery_median_s", "recovery_max_s", "wall_s")
            }
    for mode in EXCLUSION_MODES:
        excl, warm = results.get(mode), results.get("launcher_warm")
        if excl and warm:  # the goal: exclusion with a spare <= 1.5 x this
            excl["vs_launcher_warm"] = {
                k: (round(excl[k] / warm[k], 3) if excl.get(k) and warm.get(k) else None)
                for k in ("recovery_median_s", "recovery_max_s")
            }
    for mode, r in results.items():
        base = results.get("mixed_baseline" if FAULT_KIND[mode] == "mixed" else "baseline")
        if not base:
            continue
        r["vs_baseline"] = {
            k: (round(r[k] / base[k], 3) if r.get(k) and base.get(k) else None)
            for k in (
                "recovery_median_s",
                "recovery_max_s",
                "wall_s",
                "efficiency",
                "efficiency_span",
            )
        }
        r["vs_baseline"]["goodput"] = (
            round(r["trainguard"]["goodput"] / base["trainguard"]["goodput"], 3)
            if r["trainguard"]["goodput"] and base["trainguard"]["goodput"]
            else None
        )
    try:
        import nvidia_resiliency_ext as nvrx

        nvrx_version = getattr(nvrx, "__version__", None)
    except ImportError:
        nvrx_version = None
    if nvrx_version is None:
        from importlib.metadata import version

        with contextlib.suppress(Exception):
            nvrx_version = version("nvidia-resiliency-ext")
    return {
        "bench": "recovery",
        "config": {
            "modes": list(modes),
            "faults": faults,
            "seed": seed,
            "after_step": after_step,
            "steps": steps,
            "ckpt_every": ckpt_every,
            "step_sleep": step_sleep,
            "world": 4,
            "launchers": 2,
            "mixed_kinds": MIXED_KINDS,
            "engine_defer_s": engine_defer_s,
            "engine_policy": engine_policy or "backend/bench/recovery_engine.py BENCH_POLICY",
        },
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_start": os.getloadavg(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "nvrx": nvrx_version,
        },
        "modes": results,
    }


def table(result: dict[str, Any]) -> str:
    rows = [
        "| mode (fault kind) | faults recovered | recovery median / max (s) | wasted steps "
        "| wall (s) | startup (s) | efficiency: wall / first step to last | trainguard goodput "
        "| vs baseline: recovery median, wall, goodput |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, r in result["modes"].items():
        vb = r.get("vs_baseline") or {}
        rows.append(
            f"| {mode} ({r['fault_kind']}) | {r['faults_recovered']}/{r['faults_fired']}"
            f"{'' if r['completed'] else ' (incomplete: ' + str(r['error']) + ')'} "
            f"| {r['recovery_median_s']} / {r['recovery_max_s']} | {r['wasted_steps']} "
            f"| {r['wall_s']} | {r['startup_s']} "
            f"| {r['efficiency']:.1%} / {r['efficiency_span']:.1%} "
            f"| {r['trainguard']['goodput']} "
            f"| {vb.get('recovery_median_s')}, {vb.get('wall_s')}, {vb.get('goodput')} |"
        )
    phase_rows = [
        (mode, r["phases"])
        for mode, r in result["modes"].items()
        if r.get("phases") and mode not in EXCLUSION_MODES
    ]
    if phase_rows:
        rows += ["", phases_table(phase_rows)]
    rows += exclusion_tables(result)
    for mode, r in result["modes"].items():
        if r.get("warm_vs_cold"):
            w = r["warm_vs_cold"]
            rows.append(
                f"\n{mode} / launcher (same faults, same invocation): recovery median "
                f"{w['recovery_median_s']}, max {w['recovery_max_s']}, wall {w['wall_s']}"
            )
        for i, st in enumerate(r.get("pool") or []):
            if st:
                rows.append(
                    f"{mode} pool node{i}: served {st['served']}, busy answers "
                    f"{st['busy_answers']}, RSS {st['rss_bytes'] / 2**20:.0f} MiB, PSS "
                    f"{st['pss_bytes'] / 2**20:.0f} MiB (pool process + idle interpreters)"
                )
    for mode, r in result["modes"].items():
        if r.get("engine"):
            from trainguard.backend.bench.recovery_engine import decisions_table

            rows += [
                "",
                f"{mode}: what the engine chose per fault",
                "",
                decisions_table(r["engine"]),
            ]
    return "\n".join(rows)


def exclusion_tables(result: dict[str, Any]) -> list[str]:
    """The exclusion modes' phases and faults, and their ratio to launcher_warm."""
    from trainguard.backend.bench import recovery_exclusion_tables as rx

    excl = [(m, r["phases"]) for m, r in result["modes"].items() if m in EXCLUSION_MODES]
    if not excl:
        return []
    rows = ["", rx.phases_table(excl), "", rx.faults_table(result)]
    for mode, r in result["modes"].items():
        if r.get("vs_launcher_warm"):
            v = r["vs_launcher_warm"]
            rows.append(
                f"\n{mode} / launcher_warm (same invocation): recovery median "
                f"{v['recovery_median_s']}, max {v['recovery_max_s']}"
            )
    return rows


PHASES = (
    ("old_gone_s", "old workers gone"),
    ("rendezvous_s", "rendezvous round joined (last launcher)"),
    ("spawned_s", "new processes started (cold only)"),
    ("attached_s", "new workers attached (imports done)"),
    ("entered_s", "training function entered (Wrapper up)"),
    ("restore_start_s", "process group up (restore starts)"),
    ("restore_end_s", "checkpoint loaded"),
    ("recovery_s", "first step done"),
)


def phases_table(
    rows: list[tuple[str, list[dict[str, Any]]]],
    phases: tuple[tuple[str, str], ...] = PHASES,
) -> str:
    """Median seconds from the fault to each phase (`phases`: key, label; by default a
    launcher restart's), per mode."""
    import statistics

    out = [
        "| mode | " + " | ".join(label for _, label in phases) + " |",
        "|---|" + "---|" * len(phases),
    ]
    for mode, per_fault in rows:
        cells = []
        for key, _ in phases:
            vals = [f[key] for f in per_fault if f.get(key) is not None]
            cells.append(f"{statistics.median(vals):.2f}" if vals else "-")
        out.append(f"| {mode} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default=",".join(MODES), help=f"of {','.join(ALL_MODES)}")
    p.add_argument("--faults", type=int, default=5)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--after-step", type=int, default=10)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--step-sleep", type=float, default=0.02)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per mode")
    p.add_argument("--json", default=None, help="write the result here")
    p.add_argument(
        "--engine-defer-s",
        type=float,
        default=3.0,
        help="engine mode: an exception fault waits this long for trainguard's request",
    )
    p.add_argument("--engine-policy", default=None, help="engine modes: a policy TOML file")
    p.add_argument("--workdir", default=None, help="keep each run's files here")
    a = p.parse_args(argv)
    res = run(
        modes=tuple(m for m in a.modes.split(",") if m),
        faults=a.faults,
        seed=a.seed,
        after_step=a.after_step,
        steps=a.steps,
        ckpt_every=a.ckpt_every,
        step_sleep=a.step_sleep,
        timeout_s=a.timeout,
        engine_defer_s=a.engine_defer_s,
        engine_policy=a.engine_policy,
        workdir=a.workdir,
    )
    print(table(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
