"""`trainguard bench checkpoint`: what checkpointing costs the demo job's training.

The demo job (examples/train_demo.py, 4 ranks as two ft_launchers x 2, the agents' SDK
servers and the store host of `backend.bench.recovery.Nodes`), no faults, one job run per
configuration: no checkpoint, then for each interval N a synchronous save every N steps
(`torch.save` of the state by rank 0, and `dcp.save` on every rank) and
`dcp.async_save` every N steps (the demo's default; it waits for the previous save before
starting the next) and its staged variant (`async-staged`, see the demo), then no
checkpoint again (the spread of the reference).

Then, with `advice=True`, the interval trainguard's advice recommends: for each
asynchronous mode, its measured blocking time per checkpoint (median over the grid's runs)
and an MTBF (an option; by default the Llama 3 405B job's, one unexpected interruption per
~3.1 h) go into `backend.analytics.advice.recommend`; Daly's interval in seconds over the
reference step time gives N in steps. Each mode runs at its N, `repeats` times, between
no-checkpoint runs of the same length; their efficiency is reported as median and range.

Measured from the agents' records: training time = first step start -> last step end
(process start-up and the final barrier excluded); training efficiency relative to no
checkpoint = reference training time / training time (the reference is the mean of the
two no-checkpoint runs); blocking time per checkpoint = the `save` section the SDK reports
(`tg.checkpoint("save", step)`: the wait for a previous save still running, then this
save's call), the slowest rank per checkpoint, median, 90th percentile and max.
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

from trainguard.backend.analytics import advice
from trainguard.backend.bench.recovery import Nodes, logs_tail, supervise

SAVE_MODES = ("torch", "sync", "async", "async-staged")
ASYNC_MODES = ("async", "async-staged")
ALL_SAVE_MODES = ("torch", "sync", *ASYNC_MODES)
# Llama 3 405B: 419 unexpected interruptions in 54 days (reference/anchors.md), ~3.1 h
DEFAULT_MTBF_S = advice.LLAMA3_DAYS * 86400 / advice.LLAMA3_INTERRUPTIONS


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile of a non-empty list."""
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q * (len(v) - 1))))]


def advised_steps(cost_s: float, mtbf_s: float, step_s: float) -> dict[str, Any]:
    """trainguard's recommended interval (Daly, from the analytics' advice) for a save
    blocking `cost_s`, in seconds and in training steps of `step_s`."""
    rec = advice.recommend(cost_s, mtbf_s, None, None)
    interval_s = rec["daly_interval_s"]
    if interval_s is None:
        raise ValueError(f"no advice for cost {cost_s!r} s and MTBF {mtbf_s!r} s")
    return {
        "cost_s": cost_s,
        "mtbf_s": mtbf_s,
        "step_s": step_s,
        "interval_s": interval_s,
        "young_interval_s": rec["young_interval_s"],
        "every_steps": max(1, round(interval_s / step_s)),
        # the saving part of the first-order waste model, d / T
        "expected_save_waste": cost_s / interval_s,
    }


def in_run_loss(
    steps: list[tuple[float, float]],
    saves: list[tuple[float, float]],
    blocking_s: list[float],
) -> dict[str, Any]:
    """Time checkpointing cost one run, from that run alone. `steps`: (start, end) of each
    step; `saves`: (start, completion of the background save) of each save; `blocking_s`:
    each save's blocking time. A step overlapping a save window is slowed by it (the
    saving thread takes CPU, on a GPU the device-to-host copy takes bandwidth): its extra
    time is its duration minus the median duration of the steps that overlap no save.
    lost = blocking + extra (the extra summed over the overlapping steps, floored at 0,
    so lost >= blocking); efficiency = 1 - lost / (first step start -> last step end)."""
    if not steps:
        raise ValueError("no steps")
    span = max(e for _, e in steps) - min(s for s, _ in steps)
    over = [any(s < done and e > start for start, done in saves) for s, e in steps]
    quiet = [e - s for (s, e), o in zip(steps, over, strict=True) if not o]
    base = statistics.median(quiet) if quiet else None
    slowed = [e - s for (s, e), o in zip(steps, over, strict=True) if o]
    extra = max(0.0, sum(d - base for d in slowed)) if base is not None else 0.0
    lost = sum(blocking_s) + extra
    return {
        "span_s": span,
        "quiet_step_median_s": base,
        "overlapped_steps": len(slowed),
        "blocking_s": sum(blocking_s),
        "overlap_extra_s": extra,
        "lost_s": lost,
        "efficiency_in_run": 1.0 - lost / span if span > 0 else None,
    }


def _save_windows(times_dir: Path) -> list[tuple[float, float]]:
    """Each save's window over all ranks (the demo's `--ckpt-times` lines): the first
    rank's start -> the last rank's completion."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for f in sorted(times_dir.glob("rank*.jsonl")):
        for line in f.read_text().splitlines():
            d = json.loads(line)
            by_step.setdefault(int(d["step"]), []).append(d)
    return [
        (min(d["start"] for d in ds), max(d["done"] for d in ds))
        for _, ds in sorted(by_step.items())
    ]


def run_one(
    mode: str,
    interval: int,
    *,
    steps: int,
    step_sleep: float,
    timeout_s: float,
) -> dict[str, Any]:
    load_1m = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix=f"tg-ckpt-{mode}-{interval}-") as tmp:
        nodes = Nodes(Path(tmp))
        kw: dict[str, Any] = dict(
            job="bench",
            steps=steps,
            ckpt_every=max(1, interval),
            step_sleep=step_sleep,
            max_restarts=0,
            extra_args=["--ckpt-mode", mode, "--ckpt-times", str(Path(tmp) / "ckpt-times")],
        )
        try:
            sup = supervise(nodes, kw, relaunch=False, timeout_s=timeout_s)
            if sup["error"]:
                raise RuntimeError(f"{mode}@{interval}: {sup['error']}\n{logs_tail(Path(tmp))}")
            st = nodes.steps
            per_ckpt: dict[Any, float] = {}
            for e in nodes.events:
                if e.kind == "checkpoint" and e.data.get("phase") == "save_end":
                    b = e.data.get("blocking_s")
                    if isinstance(b, int | float):
                        key = e.data.get("step")
                        per_ckpt[key] = max(per_ckpt.get(key, 0.0), float(b))
            blocking = [per_ckpt[k] for k in sorted(per_ckpt, key=str)]
            # each step over the ranks: the first start -> the last end
            by_n: dict[int, tuple[float, float]] = {}
            for s in st:
                a, b = by_n.get(s.step, (s.start, s.end))
                by_n[s.step] = (min(a, s.start), max(b, s.end))
            windows = _save_windows(Path(tmp) / "ckpt-times")
            inrun = in_run_loss([by_n[n] for n in sorted(by_n)], windows, blocking)
            span = inrun["span_s"]  # the first step's start -> the last step's end
            root = Path(tmp) / "checkpoints"  # DCP's: a directory with .metadata when complete
            complete = len(
                [d for d in root.glob("step_*") if (d / ".metadata").exists() or d.suffix == ".pt"]
            )
            return {
                "mode": mode,
                "interval": interval if mode != "none" else None,
                "steps": len({s.step for s in st}),
                "load_avg_1m": load_1m,
                "train_s": round(span, 3),
                "wall_s": round(sup["end"] - sup["t0"], 2),
                "checkpoints": len(blocking),
                "complete": complete,
                "blocking_s": [round(b, 5) for b in blocking],
                "blocking_median_s": round(statistics.median(blocking), 4) if blocking else None,
                "blocking_p90_s": round(quantile(blocking, 0.9), 4) if blocking else None,
                "blocking_max_s": round(max(blocking), 4) if blocking else None,
                "blocking_total_s": round(sum(blocking), 3),
                # the share of the training time the loop was held by saves
                "blocked_share": round(sum(blocking) / span, 4) if span > 0 else None,
                # in this run alone: blocking + the extra time of steps overlapping a save
                "save_windows_s": [round(d - a, 4) for a, d in windows],
                "overlapped_steps": inrun["overlapped_steps"],
                "quiet_step_median_s": inrun["quiet_step_median_s"],
                "overlap_extra_s": round(inrun["overlap_extra_s"], 4),
                "lost_s": round(inrun["lost_s"], 4),
                "efficiency_in_run": inrun["efficiency_in_run"],
            }
        finally:
            nodes.close()


def _efficiency(rows: list[dict[str, Any]], ref_s: float) -> None:
    for r in rows:
        r["efficiency_vs_none"] = round(ref_s / r["train_s"], 4)


def _cost_s(rows: list[dict[str, Any]], mode: str) -> float | None:
    """A mode's blocking time per checkpoint: the median over all its grid checkpoints."""
    pooled = [b for r in rows if r["mode"] == mode for b in r["blocking_s"]]
    return statistics.median(pooled) if pooled else None


def run(
    intervals: tuple[int, ...] | list[int] = (10, 50),
    steps: int = 300,
    modes: tuple[str, ...] | list[str] = SAVE_MODES,
    step_sleep: float = 0.02,
    timeout_s: float = 240.0,
    advice_runs: bool = True,
    mtbf_s: float = DEFAULT_MTBF_S,
    repeats: int = 2,
    min_checkpoints: int = 3,
    advice_modes: tuple[str, ...] | list[str] = ("async", "async-staged"),
) -> dict[str, Any]:
    """The grid: no checkpoint, each mode x interval, no checkpoint again; efficiency
    relative to the mean of the two no-checkpoint runs. Then (`advice_runs`) each
    asynchronous mode at the interval the advice recommends for its measured cost and
    `mtbf_s`, `repeats` times, with `min_checkpoints` saves or more per run."""
    import torch

    def one(mode: str, n: int, k: int) -> dict[str, Any]:
        return run_one(mode, n, steps=k, step_sleep=step_sleep, timeout_s=timeout_s)

    load = os.getloadavg()
    rows = [one("none", 0, steps)]
    for n in intervals:
        rows += [one(mode, n, steps) for mode in modes]
    rows.append(one("none", 0, steps))
    ref = statistics.mean(r["train_s"] for r in rows if r["mode"] == "none")
    _efficiency(rows, ref)
    step_s = ref / steps

    advised: dict[str, dict[str, Any]] = {}
    advice_rows: list[dict[str, Any]] = []
    advice_steps = None
    if advice_runs:
        for mode in (m for m in modes if m in advice_modes):
            cost = _cost_s(rows, mode)
            if cost:
                advised[mode] = advised_steps(cost, mtbf_s, step_s)
    if advised:
        advice_steps = max(steps, *(min_checkpoints * a["every_steps"] for a in advised.values()))
        for _ in range(repeats):  # interleaved, so a drift of the machine's load hits all
            advice_rows.append(one("none", 0, advice_steps))
            advice_rows += [one(m, a["every_steps"], advice_steps) for m, a in advised.items()]
        advice_rows.append(one("none", 0, advice_steps))
        advice_ref = statistics.mean(r["train_s"] for r in advice_rows if r["mode"] == "none")
        _efficiency(advice_rows, advice_ref)
        for mode, a in advised.items():
            mine = [r for r in advice_rows if r["mode"] == mode]
            eff = [r["efficiency_vs_none"] for r in mine]
            blocking = [b for r in mine for b in r["blocking_s"]]
            a.update(
                efficiency_median=statistics.median(eff),
                efficiency_min=min(eff),
                efficiency_max=max(eff),
                blocked_share_median=statistics.median(r["blocked_share"] for r in mine),
                blocking_median_s=statistics.median(blocking) if blocking else None,
                reaches_99=statistics.median(eff) > 0.99,
                efficiency_in_run=[r["efficiency_in_run"] for r in mine],
                efficiency_in_run_min=min(r["efficiency_in_run"] for r in mine),
                # in-run: every run of the mode above 99 %
                reaches_99_in_run=min(r["efficiency_in_run"] for r in mine) > 0.99,
            )
        nones = [r["train_s"] for r in advice_rows if r["mode"] == "none"]
        noise = {"none_min_s": min(nones), "none_max_s": max(nones), "ref_s": advice_ref}
    return {
        "bench": "checkpoint",
        "config": {
            "intervals": list(intervals),
            "modes": list(modes),
            "steps": steps,
            "step_sleep": step_sleep,
            "world": 4,
            "mtbf_s": mtbf_s,
            "repeats": repeats,
            "advice_modes": list(advice_modes),
            "advice_steps": advice_steps,
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
        "advised": advised,
        "advice_rows": advice_rows,
        "advice_reference": noise if advised else None,
    }


def _row(r: dict[str, Any]) -> str:
    return (
        f"| {r['mode']} | {r['interval'] or '-'} | {r['steps']} | {r['load_avg_1m']} "
        f"| {r['train_s']} | {r['efficiency_vs_none']:.1%} | {r['checkpoints']} "
        f"| {r['blocking_median_s']} / {r['blocking_p90_s']} / {r['blocking_max_s']} "
        f"| {r['blocked_share']:.2%} | {r['overlapped_steps']} | {r['overlap_extra_s']} "
        f"| {r['lost_s']} | {r['efficiency_in_run']:.2%} |"
    )


def table(result: dict[str, Any]) -> str:
    head = [
        "| checkpoint | every N steps | steps | load 1 min | training time (s) "
        "| efficiency vs none (between runs) | checkpoints "
        "| blocking per checkpoint median / p90 / max (s) | blocked share "
        "| steps overlapping a save | their extra time (s) | lost in run (s) "
        "| efficiency in run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    out = head + [_row(r) for r in result["rows"]]
    if result.get("advised"):
        mtbf_h = result["config"]["mtbf_s"] / 3600
        out += ["", f"At the advised interval (MTBF {mtbf_h:.2f} h):", ""]
        out += head + [_row(r) for r in result["advice_rows"]]
        out += [
            "",
            "| checkpoint | cost (s) | Daly interval (s) | every N steps | efficiency vs none "
            "(between runs) median (min-max) | blocked share median | > 99 % (between runs) "
            "| efficiency in run, each run | > 99 % in run (every run) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for mode, a in result["advised"].items():
            out.append(
                f"| {mode} | {a['cost_s']:.4f} | {a['interval_s']:.2f} | {a['every_steps']} "
                f"| {a['efficiency_median']:.1%} ({a['efficiency_min']:.1%}-"
                f"{a['efficiency_max']:.1%}) | {a['blocked_share_median']:.2%} "
                f"| {'yes' if a['reaches_99'] else 'no'} "
                f"| {', '.join(f'{e:.2%}' for e in a['efficiency_in_run'])} "
                f"| {'yes' if a['reaches_99_in_run'] else 'no'} |"
            )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--intervals", default="10,50")
    p.add_argument("--modes", default=",".join(SAVE_MODES))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--step-sleep", type=float, default=0.02)
    p.add_argument("--no-advice", action="store_true", help="the grid only")
    p.add_argument("--mtbf-h", type=float, default=DEFAULT_MTBF_S / 3600)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--advice-modes", default="async,async-staged")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    res = run(
        intervals=tuple(int(x) for x in a.intervals.split(",") if x),
        steps=a.steps,
        modes=tuple(m for m in a.modes.split(",") if m),
        step_sleep=a.step_sleep,
        advice_runs=not a.no_advice,
        mtbf_s=a.mtbf_h * 3600,
        repeats=a.repeats,
        advice_modes=tuple(m for m in a.advice_modes.split(",") if m),
    )
    print(table(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
