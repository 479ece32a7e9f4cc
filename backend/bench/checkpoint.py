"""`trainguard bench checkpoint`: what checkpointing costs the demo job's training.

The demo job (examples/train_demo.py, 4 ranks as two ft_launchers x 2, the agents' SDK
servers and the store host of `backend.bench.recovery.Nodes`), no faults, one job run per
configuration: no checkpoint, then for each interval N a synchronous save every N steps
(`torch.save` of the state by rank 0, and `dcp.save` on every rank) and
`dcp.async_save` every N steps (the demo's default; it waits for the previous save before
starting the next), then no checkpoint again (the spread of the reference).

Measured from the agents' records: training time = first step start -> last step end
(process start-up and the final barrier excluded); training efficiency relative to no
checkpoint = reference training time / training time (the reference is the mean of the
two no-checkpoint runs); blocking time per checkpoint = the `save` section the SDK reports
(`tg.checkpoint("save", step)`), the slowest rank per checkpoint, median and max.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from backend.bench.recovery import Nodes, logs_tail, supervise

SAVE_MODES = ("torch", "sync", "async")


def run_one(
    mode: str,
    interval: int,
    *,
    steps: int,
    step_sleep: float,
    timeout_s: float,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"tg-ckpt-{mode}-{interval}-") as tmp:
        nodes = Nodes(Path(tmp))
        kw: dict[str, Any] = dict(
            job="bench",
            steps=steps,
            ckpt_every=max(1, interval),
            step_sleep=step_sleep,
            max_restarts=0,
            extra_args=["--ckpt-mode", mode],
        )
        try:
            sup = supervise(nodes, kw, relaunch=False, timeout_s=timeout_s)
            if sup["error"]:
                raise RuntimeError(f"{mode}@{interval}: {sup['error']}\n{logs_tail(Path(tmp))}")
            st = nodes.steps
            span = max(s.end for s in st) - min(s.start for s in st)
            per_ckpt: dict[Any, float] = {}
            for e in nodes.events:
                if e.kind == "checkpoint" and e.data.get("phase") == "save_end":
                    b = e.data.get("blocking_s")
                    if isinstance(b, int | float):
                        key = e.data.get("step")
                        per_ckpt[key] = max(per_ckpt.get(key, 0.0), float(b))
            blocking = sorted(per_ckpt.values())
            return {
                "mode": mode,
                "interval": interval if mode != "none" else None,
                "steps": len({s.step for s in st}),
                "train_s": round(span, 3),
                "wall_s": round(sup["end"] - sup["t0"], 2),
                "checkpoints": len(blocking),
                "blocking_median_s": round(statistics.median(blocking), 4) if blocking else None,
                "blocking_max_s": round(max(blocking), 4) if blocking else None,
                "blocking_total_s": round(sum(blocking), 3),
                # the share of the training time the loop was held by saves
                "blocked_share": round(sum(blocking) / span, 4) if span > 0 else None,
            }
        finally:
            nodes.close()


def run(
    intervals: tuple[int, ...] | list[int] = (10, 50),
    steps: int = 300,
    modes: tuple[str, ...] | list[str] = SAVE_MODES,
    step_sleep: float = 0.02,
    timeout_s: float = 240.0,
) -> dict[str, Any]:
    """No checkpoint, each mode x interval, no checkpoint again; efficiency relative to the
    mean of the two no-checkpoint runs."""
    import torch

    load = os.getloadavg()
    rows = [run_one("none", 0, steps=steps, step_sleep=step_sleep, timeout_s=timeout_s)]
    for n in intervals:
        for mode in modes:
            rows.append(run_one(mode, n, steps=steps, step_sleep=step_sleep, timeout_s=timeout_s))
    rows.append(run_one("none", 0, steps=steps, step_sleep=step_sleep, timeout_s=timeout_s))
    ref = statistics.mean(r["train_s"] for r in rows if r["mode"] == "none")
    for r in rows:
        r["efficiency_vs_none"] = round(ref / r["train_s"], 4)
    return {
        "bench": "checkpoint",
        "config": {
            "intervals": list(intervals),
            "modes": list(modes),
            "steps": steps,
            "step_sleep": step_sleep,
            "world": 4,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_start": load,
            "load_avg_end": os.getloadavg(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "finished_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        },
        "reference_train_s": round(ref, 3),
        "rows": rows,
    }


def table(result: dict[str, Any]) -> str:
    out = [
        "| checkpoint | every N steps | training time (s) | efficiency vs none "
        "| checkpoints | blocking per checkpoint median / max (s) | blocked share |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        out.append(
            f"| {r['mode']} | {r['interval'] or '-'} | {r['train_s']} "
            f"| {r['efficiency_vs_none']:.1%} | {r['checkpoints']} "
            f"| {r['blocking_median_s']} / {r['blocking_max_s']} | {r['blocked_share']:.2%} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--intervals", default="10,50")
    p.add_argument("--modes", default=",".join(SAVE_MODES))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--step-sleep", type=float, default=0.02)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    res = run(
        intervals=tuple(int(x) for x in a.intervals.split(",") if x),
        steps=a.steps,
        modes=tuple(m for m in a.modes.split(",") if m),
        step_sleep=a.step_sleep,
    )
    print(table(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
