"""What the recovery bench measures, from the records the agents collected
(`backend/bench/recovery.py` runs the jobs; the definitions are in its docstring): recovery
per fault, wasted steps, productive time and efficiency, and trainguard's own goodput
accounting over the same records."""

from __future__ import annotations

import math
import re
import statistics
from typing import Any

_FAULT_RE = re.compile(r"injecting fault (\d+): \S+.* on rank (\d+) at step (\d+)")


def trainguard_goodput(
    nodes: Any,
    t0: float,
    end: float,
    incidents: list[tuple[float, float | None]],
    relaunches: list[float] | tuple[float, ...] = (),
) -> dict[str, Any]:
    """Goodput and badput as the backend accounts them (backend/analytics/goodput.py) over
    the same step reports, checkpoint events and incidents (fault -> recovered). A full
    relaunch restarts TORCHELASTIC_RESTART_COUNT at 0: its steps are labelled with the
    supervisor's launch number as the attempt, so each launch is a generation of its own."""
    from trainguard.backend.analytics.goodput import CohortStep, account

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


def last_executions(steps: list[Any]) -> dict[int, tuple[float, float]]:
    """For each step number, the span (earliest start, latest end) of its last execution.

    One execution of a step is one generation's reports of it: in lock-step training every
    rank is inside the step when its all-reduce completes, so those reports overlap in
    time, while a restart separates two executions of the same step. The reports of a step
    are grouped by that overlap, and the group that ended last is the last execution.

    Grouping by (step, rank) instead, and merging each rank's own last execution, mixes
    generations when a rank's report of a redone step is missing (the SDK sends its queue
    once a second, so a SIGKILLed rank and the node-mates its launcher ends lose their last
    second of reports): the merged span then runs from one generation's execution to the
    next one's, across the restart between them."""
    by_step: dict[int, list[tuple[float, float]]] = {}
    for s in steps:
        by_step.setdefault(s.step, []).append((float(s.start), float(s.end)))
    last: dict[int, tuple[float, float]] = {}
    for n, spans in by_step.items():
        spans.sort()
        b, e = spans[0]
        for sb, se in spans[1:]:
            if sb > e:  # a later execution: the one before it is not the last
                b, e = sb, se
            else:
                e = max(e, se)
        last[n] = (b, e)
    return last


def covered(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of the spans: an instant two steps' spans share (one
    rank already in step n + 1 while a slower one finishes step n) counts once, so the sum
    can never exceed the time from the first start to the last end."""
    total, reach = 0.0, -math.inf
    for b, e in sorted(spans):
        if e > reach:
            total += e - max(b, reach)
            reach = e
    return total


def fired_faults(events: list[Any]) -> list[tuple[float, int, int, int]]:
    """(ts, index, rank, step) of each fault, from the SDK's "injecting fault" log."""
    fired = []
    for e in events:
        m = _FAULT_RE.search(e.message) if e.kind == "log" else None
        if m:
            fired.append((float(e.ts), int(m.group(1)), int(m.group(2)), int(m.group(3))))
    return sorted(fired)


def analyse(
    nodes: Any,
    t0: float,
    end: float,
    world: int = 4,
    relaunches: list[float] | tuple[float, ...] = (),
    fired: list[tuple[float, int, int, int]] | None = None,
    resumed_after: dict[int, float] | None = None,
    resume_world: int | None = None,
) -> dict[str, Any]:
    """Recovery per fault, wasted steps, productive time and efficiency from the agents'
    records (see the module docstring for the definitions).

    `fired`: the faults as (ts, index, rank, step) where they are not the SDK's injection
    logs (a fault from outside the ranks, such as an XID). `resumed_after`: per fault
    index, the time before which no step counts as resumed (a fault that does not stop
    the ranks lets the old generation train on until it is ended). `resume_world`: the
    ranks that train after a fault, where the job re-forms smaller (`--nnodes MIN:MAX`)."""
    fired = fired_faults(nodes.events) if fired is None else sorted(fired)
    steps = sorted(nodes.steps, key=lambda s: s.end)
    per_fault = []
    for ts, index, rank, fstep in fired:
        cut = max(ts, (resumed_after or {}).get(index, ts))
        firsts: dict[int, Any] = {}
        for s in steps:
            if s.start > cut and s.end > ts and s.rank not in firsts:
                firsts[s.rank] = s
        if len(firsts) < (resume_world or world):  # the job never got going again
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
    runs: dict[tuple[int, int], int] = {}
    for s in steps:
        runs[(s.step, s.rank)] = runs.get((s.step, s.rank), 0) + 1
    last = last_executions(steps)
    productive = covered(list(last.values()))
    durations = sorted(e - b for b, e in last.values())
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
        "steps_done": (max(last) + 1) if last else 0,
        "step_median_s": round(durations[len(durations) // 2], 4) if durations else None,
        "wall_s": round(wall, 2),
        "startup_s": round(first_start - t0, 2),
        "productive_s": round(productive, 2),
        "efficiency": round(productive / wall, 4) if wall > 0 else None,
        # first step start -> last step end: start-up and shutdown left out
        "train_span_s": round(span, 2),
        "efficiency_span": round(productive / span, 4) if span > 0 else None,
    }


_JOINED_RE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\].* has joined round (\d+) of the rendezvous"
)


def rendezvous_rounds(logs: list[str]) -> list[float]:
    """When each launcher joined each rendezvous round after the first (ft_launcher's
    and torchrun's log lines `... has joined round N of the rendezvous ...`, local time
    of this machine), as epoch seconds."""
    from datetime import datetime

    out = []
    for text in logs:
        for line in text.splitlines():
            m = _JOINED_RE.match(line)
            if m and int(m.group(3)) > 0:
                t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
                out.append(t + int(m.group(2)) / 1000)
    return sorted(out)


def recovery_phases(
    nodes: Any,
    per_fault: list[dict[str, Any]],
    rounds: list[float] | tuple[float, ...] = (),
    fired: list[tuple[float, int, int, int]] | None = None,
) -> list[dict[str, Any]]:
    """Seconds from each recovered fault to the phases of its launcher restart, from the
    agents' records and the launchers' logs: the last old worker's `rank_exit`, the last
    launcher joining the new rendezvous round (`rounds`), the first new worker process's
    start (not for warm workers: they were forked before the fault), the last new
    worker's `rank_start` (it attached: its imports are done), the last one to enter its
    training function (its first `iteration` message: NVRx's Wrapper is up), the last
    `restore_start`
    (process groups built, the checkpoint chosen) and `restore_end` (checkpoint loaded),
    and the first step done (the recovery). Empty for faults without a new generation
    (in-process restarts). `fired`: as for `analyse`."""
    faults = fired_faults(nodes.events) if fired is None else fired
    fired_at = {index: ts for ts, index, _rank, _step in faults}
    starts: dict[int, float] = getattr(nodes, "proc_starts", {})
    out = []
    for f in per_fault:
        ts = fired_at.get(f["index"])
        if ts is None or not f.get("recovered"):
            continue
        end = ts + f["recovery_s"]
        window = [e for e in nodes.events if ts <= float(e.ts) <= end]
        begun = [e for e in window if e.kind == "rank_start"]
        if not begun:
            continue
        first_new = min(float(e.ts) for e in begun)

        pids = [e.data.get("pid") for e in begun]
        spawned = [starts[p] for p in pids if isinstance(p, int) and p in starts]
        entered = [
            nodes.entered[p]
            for p in pids
            if isinstance(p, int) and p in getattr(nodes, "entered", {})
        ]
        out.append(
            {
                "index": f["index"],
                "old_gone_s": _last(window, ts, "rank_exit", before=first_new),
                "rendezvous_s": max(
                    (round(r - ts, 3) for r in rounds if ts < r <= first_new), default=None
                ),
                "spawned_s": round(min(spawned) - ts, 3) if spawned and min(spawned) > ts else None,
                "attached_s": round(max(float(e.ts) for e in begun) - ts, 3),
                "entered_s": round(max(entered) - ts, 3) if entered else None,
                "restore_start_s": _last(window, ts, "checkpoint", "restore_start"),
                "restore_end_s": _last(window, ts, "checkpoint", "restore_end"),
                "recovery_s": f["recovery_s"],
            }
        )
    return out


def _last(
    events: list[Any],
    since: float,
    kind: str,
    phase: str | None = None,
    before: float = math.inf,
) -> float | None:
    """Seconds from `since` to the last event of `kind` (and checkpoint `phase`) up to
    `before`."""
    hits = [
        float(e.ts)
        for e in events
        if e.kind == kind
        and float(e.ts) <= before
        and (phase is None or e.data.get("phase") == phase)
    ]
    return round(max(hits) - since, 3) if hits else None
