"""`trainguard bench chaos`: the demo's training job under mixed seeded faults, against a
real `trainguard server`, for M minutes; then what trainguard did, judged.

Every part is a real process talking real HTTP, as in `trainguard demo`: the server
(SQLite in the bench's data dir, `recovery_engine.Backend`), one `trainguard agent
--simulate 2` process per simulated node, the NVRx Wrapper's store hosted by the bench,
and the demo job (backend/demojob.py: one ft_launcher x 2 ranks of examples/train_demo.py
per node). The job injects its own seeded faults (examples/faults.py: exception, SIGKILL,
hang, XID 79 through the node's agent), a new run of it (next seed) starts when one ends,
and the bench brings faults from outside now and then (backend/bench/chaos_outside.py:
an agent killed or stopped and started again, the user's SIGTERM of the job's launchers,
an operator's launcher restarts against a small --max-restarts). When the minutes are
over the bench waits for the open incidents to close, stops the job, the agents and the
server, and reports (backend/bench/chaos_report): incidents by status and outcome,
wrongful actions, false states (chaos_states.py), recovery p50/p99 per fault kind, the
API against the processes, and the invariants of every incident's timeline.

Every process it starts is stopped on the way out, also on Ctrl-C, SIGTERM or an error.
The options and the fault plan are backend/bench/chaos_config.py, the processes
backend/bench/chaos_procs.py; this module runs them.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trainguard.backend.bench.chaos_config import (
    ChaosConfig,
    ChaosError,
    parse_config,
)
from trainguard.backend.bench.chaos_procs import STOPPED, Chaos, JobRun

__all__ = ["ChaosConfig", "ChaosError", "parse_config", "run"]


_STOPS = (signal.SIGINT, signal.SIGTERM)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _run_row(r: JobRun) -> dict[str, Any]:
    return {
        "job": r.job,
        "fault_seed": r.seed,
        "max_restarts": r.max_restarts,
        "started_at": r.started_at,
        "sigterm_at": r.sigterm_at,
        "ended_at": r.ended_at,
        "end": r.end,
        "exit_codes": r.exit_codes,
        "goodput_reads": r.goodput_reads,
    }


def run(
    cfg: ChaosConfig, workdir: str | os.PathLike[str] | None = None, out: Path | None = None
) -> dict[str, Any]:
    """One bench run (see the module docstring); the report, also written to `out`."""
    from trainguard.backend.bench.chaos_report import build_report

    if out is not None and not out.parent.is_dir():
        raise ChaosError(f"--out: no directory {out.parent}")
    try:
        import nvidia_resiliency_ext  # noqa: F401 - imported to check it is installed
        import torch
    except ImportError as exc:
        raise ChaosError(
            f"{exc}; the bench needs the train extra: pip install 'trainguard[train]'"
        ) from None
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main else None
    tmp = None if workdir else tempfile.TemporaryDirectory(prefix="tg-chaos-")
    work = Path(workdir or tmp.name).resolve()  # type: ignore[union-attr]  # tmp is set when workdir is not
    work.mkdir(parents=True, exist_ok=True)
    chaos = Chaos(work, cfg)
    interrupted = False
    load_start = os.getloadavg()
    try:
        chaos.up()
        try:
            chaos.loop()
            chaos.settle()
        except KeyboardInterrupt:
            interrupted = True  # stop at once, and report what was seen
        chaos.stop_at = time.time()
        chaos.outside.over.set()
        if chaos.outside.dead is not None:  # interrupted while an agent was dead: it stays so
            chaos.outside.deaths.append({**chaos.outside.dead, "back_at": chaos.stop_at})
            chaos.outside.dead = None
        for r in chaos.runs:
            chaos.end_run(r, STOPPED)
        chaos.stop_agents()  # each sends what it holds before it exits
        try:
            rows = chaos.collect()
        except Exception as exc:
            if interrupted:  # Ctrl-C also reaches the server: say so in one line
                raise ChaosError(f"interrupted, and no report: {exc}") from None
            raise
        steps = rows["steps"]
        report = build_report(
            faults=chaos.rank_faults(steps) + chaos.outside_faults(),
            incidents=rows["incidents"],
            steps=steps,
            commands=rows["commands"],
            cordons=rows["cordons"],
            node_events=rows["node_events"],
            observations=chaos.observations,
            start=chaos.start,
            stop=chaos.stop_at,
            down_after_s=cfg.down_after_s,
            runs=[_run_row(r) for r in chaos.runs],
            posts=chaos.outside.posts,
            read_at=rows["read_at"],
            relaunch_wait_s=chaos.relaunch_wait_s,
        )
        report["incidents"]["read_from"] = rows["incidents_from"]
    finally:
        # a second Ctrl-C must not cut the clean-up short
        held = [(n, signal.signal(n, signal.SIG_IGN)) for n in _STOPS] if main else []
        try:
            chaos.down()
        finally:
            for n, handler in held:
                signal.signal(n, handler)
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            if tmp is not None:
                tmp.cleanup()
    report = {
        "bench": "chaos",
        "interrupted": interrupted,
        "config": {
            **asdict(cfg),
            "world": cfg.world,
            "workdir": str(work) if workdir else None,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_start": load_start,
            "load_avg_end": os.getloadavg(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "agent_exits": chaos.agent_exits,
        "runs": [_run_row(r) for r in chaos.runs],
        "outside": {
            "agents_down": chaos.outside.deaths,
            "user_sigterms": chaos.outside.sigterms,
            "operator_posts": chaos.outside.posts,
        },
        **report,
    }
    if out is not None:
        out.write_text(json.dumps(report, indent=1, default=str))
    return report
