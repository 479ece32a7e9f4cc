"""`trainguard bench recovery`: AWS's NVRx experiment on CPU, one run per restart mode.

The demo job (examples/train_demo.py: an MLP on synthetic data, gloo, 4 ranks as two
ft_launchers x 2 ranks, each launcher's ranks reporting to their own agent's LocalServer,
the Wrapper's store hosted outside the ranks) with `faults` seeded faults (agent/faults.py,
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

Measured from what the agents saw (the SDK's step reports and its "injecting fault" log):
recovery per fault = fault -> first step completed after it (started after it), of the
slowest rank; wasted steps = fault step - the step training resumed at; wall time = launch
-> every launcher exited 0; productive time = for each step, the duration of its last
execution (earliest start to latest end over the ranks); training efficiency = productive
time / wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

MODES = ("baseline", "launcher", "in_process")
FAULT_KIND = {"baseline": "exception", "launcher": "sigkill", "in_process": "exception"}
_FAULT_RE = re.compile(r"injecting fault (\d+): \S+.* on rank (\d+) at step (\d+)")


class Nodes:
    """Two imitated nodes: an agent (simulated GPUs) with its LocalServer each, and the
    Wrapper's store host; collects what the agents saw."""

    def __init__(self, workdir: Path, count: int = 2) -> None:
        from agent import demojob
        from agent.config import AgentConfig
        from agent.daemon import build_agent
        from agent.local import LocalServer
        from agent.storehost import StoreHost

        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.store = StoreHost(port=demojob.free_port())
        self.store.start()
        self.locals: list[Any] = []
        self.agents: list[Any] = []
        for i in range(count):
            cfg = AgentConfig(
                node=f"node{i}",
                simulate=2,
                spool_dir=workdir / f"spool{i}",
                socket_path=workdir / f"agent{i}.sock",
                kmsg_path=None,
            )
            agent = build_agent(cfg)
            local = LocalServer(agent)
            local.start()
            self.agents.append(agent)
            self.locals.append(local)
        self.events: list[Any] = []
        self.steps: list[Any] = []

    @property
    def sockets(self) -> list[str]:
        return [str(loc.socket_path) for loc in self.locals]

    def collect(self) -> Nodes:
        for a in self.agents:
            d = a.outbox.drain(10**6, 10**6, 10**6)
            self.events += d.events
            self.steps += d.steps
        return self

    def close(self) -> None:
        for loc in self.locals:  # any worker a launcher left behind
            for pid, rec in list(loc.ranks.items()):
                if rec.alive:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
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
    from agent import demojob

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


def trainguard_goodput(
    nodes: Nodes,
    t0: float,
    end: float,
    incidents: list[tuple[float, float | None]],
    relaunches: list[float] | tuple[float, ...] = (),
) -> dict[str, Any]:
    """Goodput and badput as the backend accounts them (backend/analytics/goodput.py) over
    the same step reports, checkpoint events and incidents (fault -> recovered). A full
    relaunch restarts TORCHELASTIC_RESTART_COUNT at 0: its steps are labelled with the
    supervisor's launch number as the attempt, so each launch is a generation of its own."""
    from backend.analytics.goodput import CohortStep, account

    cohort: dict[tuple[int, int, int], list[float]] = {}
    for s in nodes.steps:
        attempt = s.attempt + sum(1 for r in relaunches if s.start > r)
        key = (attempt, s.iteration, s.step)
        c = cohort.get(key)
        if c is None:
            cohort[key] = [s.start, s.end]
        else:
            c[0], c[1] = min(c[0], s.start), max(c[1], s.end)
    steps = [CohortStep(a, i, n, v[0], v[1]) for (a, i, n), v in cohort.items()]
    spans: dict[str, list[tuple[float, float]]] = {"save_end": [], "restore_end": []}
    for e in nodes.events:
        if e.kind == "checkpoint" and e.data.get("phase") in spans:
            b = e.data.get("blocking_s")
            if isinstance(b, int | float):
                spans[str(e.data["phase"])].append((float(e.ts) - float(b), float(e.ts)))
    acc = account(
        steps,
        job_start=t0,
        first_step_start=min((s.start for s in steps), default=None),
        since=t0,
        until=end,
        saves=spans["save_end"],
        restores=spans["restore_end"],
        incidents=incidents,
        points=1,
    )
    return {
        "goodput": round(acc.goodput, 4) if acc.goodput is not None else None,
        "productive_s": round(acc.productive_s, 2),
        "badput_s": {k: round(v, 2) for k, v in acc.badput.items()},
        "ideal_step_s": round(acc.ideal_step_s, 4) if acc.ideal_step_s else None,
    }


def analyse(
    nodes: Nodes,
    t0: float,
    end: float,
    world: int = 4,
    relaunches: list[float] | tuple[float, ...] = (),
) -> dict[str, Any]:
    """Recovery per fault, wasted steps, productive time and efficiency from the agents'
    records (see the module docstring for the definitions)."""
    fired = []
    for e in nodes.events:
        m = _FAULT_RE.search(e.message) if e.kind == "log" else None
        if m:
            fired.append((float(e.ts), int(m.group(1)), int(m.group(2)), int(m.group(3))))
    fired.sort()
    steps = sorted(nodes.steps, key=lambda s: s.end)
    per_fault = []
    for ts, index, rank, fstep in fired:
        firsts: dict[int, Any] = {}
        for s in steps:
            if s.start > ts and s.end > ts and s.rank not in firsts:
                firsts[s.rank] = s
        if len(firsts) < world:  # the job never got going again after this fault
            per_fault.append({"index": index, "rank": rank, "step": fstep, "recovered": False})
            continue
        resumed = min(s.step for s in firsts.values())
        per_fault.append(
            {
                "index": index,
                "rank": rank,
                "step": fstep,
                "recovered": True,
                "recovery_s": round(max(s.end for s in firsts.values()) - ts, 3),
                "resumed_at_step": resumed,
                "wasted_steps": max(0, fstep - resumed),
            }
        )
    last: dict[tuple[int, int], Any] = {}  # (step, rank) -> its last execution
    runs: dict[tuple[int, int], int] = {}
    for s in steps:
        last[(s.step, s.rank)] = s
        runs[(s.step, s.rank)] = runs.get((s.step, s.rank), 0) + 1
    by_step: dict[int, list[Any]] = {}
    for (n, _r), s in last.items():
        by_step.setdefault(n, []).append(s)
    productive = sum(max(s.end for s in v) - min(s.start for s in v) for v in by_step.values())
    durations = sorted(max(s.end for s in v) - min(s.start for s in v) for v in by_step.values())
    recovered = [f["recovery_s"] for f in per_fault if f["recovered"]]
    wall = end - t0
    first_start = min((s.start for s in steps), default=end)
    span = max((s.end for s in steps), default=end) - first_start
    incidents = [
        (ts, ts + f["recovery_s"] if f["recovered"] else None)
        for (ts, *_), f in zip(fired, per_fault, strict=True)
    ]
    return {
        "trainguard": trainguard_goodput(nodes, t0, end, incidents, relaunches),
        "faults_fired": len(fired),
        "faults_recovered": len(recovered),
        "per_fault": per_fault,
        "recovery_median_s": round(statistics.median(recovered), 3) if recovered else None,
        "recovery_max_s": round(max(recovered), 3) if recovered else None,
        "wasted_steps": sum(f.get("wasted_steps", 0) for f in per_fault),
        "redone_step_executions": max(
            (sum(c - 1 for (n, r), c in runs.items() if r == rank) for rank in range(world)),
            default=0,
        ),
        "steps_done": (max(by_step) + 1) if by_step else 0,
        "step_median_s": round(durations[len(durations) // 2], 4) if durations else None,
        "wall_s": round(wall, 2),
        "startup_s": round(first_start - t0, 2),
        "productive_s": round(productive, 2),
        "efficiency": round(productive / wall, 4) if wall > 0 else None,
        # first step start -> last step end: start-up and shutdown left out
        "train_span_s": round(span, 2),
        "efficiency_span": round(productive / span, 4) if span > 0 else None,
    }


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
) -> dict[str, Any]:
    """One mode, one job run (a fresh work directory: no checkpoints, no fired faults)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    with tempfile.TemporaryDirectory(prefix=f"tg-recovery-{mode}-") as tmp:
        work = Path(workdir or tmp) / mode
        nodes = Nodes(work)
        kw: dict[str, Any] = dict(
            job="bench",
            steps=steps,
            ckpt_every=ckpt_every,
            faults=faults,
            fault_seed=seed,
            fault_after_step=after_step,
            fault_kinds=FAULT_KIND[mode],
            step_sleep=step_sleep,
        )
        if mode == "baseline":
            kw.update(max_restarts=0, extra_args=["--no-wrapper"])
        elif mode == "launcher":
            kw.update(max_restarts=faults + 2)
        try:
            sup = supervise(nodes, kw, relaunch=(mode == "baseline"), timeout_s=timeout_s)
            out = analyse(nodes, sup["t0"], sup["end"], relaunches=sup["relaunches"])
            out.update(
                mode=mode,
                fault_kind=FAULT_KIND[mode],
                completed=sup["completed"],
                error=sup["error"],
                relaunches=len(sup["relaunches"]),
                attempts=len({s.attempt for s in nodes.steps}),
                iterations=len({(s.attempt, s.iteration) for s in nodes.steps}),
            )
            if sup["error"]:
                out["log_tail"] = logs_tail(work)
            return out
        finally:
            nodes.close()


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
) -> dict[str, Any]:
    """Each mode in its own job run, in order; ratios to the baseline when it ran."""
    import torch

    results = {}
    for mode in modes:
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
        )
    base = results.get("baseline")
    if base:
        for r in results.values():
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
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--faults", type=int, default=5)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--after-step", type=int, default=10)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--step-sleep", type=float, default=0.02)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per mode")
    p.add_argument("--json", default=None, help="write the result here")
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
    )
    print(table(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
