"""Goodput and badput accounting of one job over one time window (pure; docs/goodput.md).

The window [since, until] is cut into labelled pieces so that productive time plus the
badput buckets add up to the elapsed time exactly. Where labelled intervals overlap, the
highest priority wins:

    checkpoint_restore > checkpoint_save > waiting > recovery > wasted_progress > step
    > initialization

and time no interval covers is `other`. The intervals:

- step: cohort step n of a generation occupies (end of the previous cohort step of the same
  generation, end of step n]; the first step of a generation [its start, its end]. A cohort
  step's start is the earliest rank's start, its end the slowest rank's end. The time left
  to a step after carve-outs is split into productive (up to k x ideal, k = the step
  numbers it covers) and straggler (the excess). ideal = mean of the per-step times that
  are <= median + 3 MAD (ml-goodput-measurement).
- wasted_progress: the steps redone (`redone`, the one definition that incidents' lost
  steps use too): every execution that a later restart discarded by resuming from its
  step number or an earlier one.
- recovery: every incident, fault_at -> the start of the step that resumed training (the
  step that ends at resumed_at is productive work; without resumed_at: to the end of the
  first cohort step that ends after the fault, else to `until`); and every gap between
  generations (last step end of one -> first step start of the next).
- checkpoint_save / checkpoint_restore: the blocking part reported by the SDK,
  [ts - blocking_s, ts] of each *_end event, merged over ranks.
- initialization: job start -> start of the job's first step.
- reduced_world: a step that ran at a smaller world than the job's largest (an elastic
  job that re-formed on fewer nodes after an exclusion) is productive at its size only:
  of its productive time, the share w / W is productive and the rest is reduced_world
  (w: the world size its generation's ranks registered with, W: the job's largest).
- waiting: a job that waits for capacity (every node it could run on is cordoned), from
  when it began to wait (or its last step, if it trained on) to `until`. The job holds no
  GPUs then, so this time is reported but left out of goodput:
  goodput = productive / (elapsed - waiting), which stays put while the job waits.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter

BUCKETS = (
    "initialization",
    "checkpoint_save",
    "checkpoint_restore",
    "recovery",
    "waiting",
    "wasted_progress",
    "reduced_world",
    "straggler",
    "other",
)

# Interval priorities, highest first (lower number wins).
_RESTORE, _SAVE, _WAITING, _RECOVERY, _WASTED, _STEP, _INIT = range(7)
_PRIO_BUCKET = {
    _RESTORE: "checkpoint_restore",
    _SAVE: "checkpoint_save",
    _WAITING: "waiting",
    _RECOVERY: "recovery",
    _WASTED: "wasted_progress",
    _INIT: "initialization",
}


@dataclass(frozen=True, slots=True)
class CohortStep:
    attempt: int
    iteration: int
    step: int
    start: float  # the earliest rank's start
    end: float  # the slowest rank's end


@dataclass(frozen=True, slots=True)
class Disruption:
    """A change of generation: the old one's last step end, the new one's first start."""

    last_end: float
    first_start: float
    attempt: int
    iteration: int
    covered_by_incident: bool


@dataclass
class Accounting:
    since: float
    until: float
    elapsed_s: float
    productive_s: float
    badput: dict[str, float]
    series: list[dict[str, float]]
    ideal_step_s: float | None
    productive_steps: int
    wasted_steps: int
    disruptions: list[Disruption] = field(default_factory=list)

    @property
    def goodput(self) -> float | None:
        """Productive share of the job's time: time waiting for capacity is not the job's
        (it holds no GPUs), so a waiting job's goodput does not fall while it waits."""
        job_time = self.elapsed_s - self.badput.get("waiting", 0.0)
        return self.productive_s / job_time if job_time > 1e-9 else None


def ideal_step_time(times: Sequence[float]) -> float | None:
    """Mean of the step times <= median + 3 MAD (ml-goodput-measurement's ideal)."""
    if not times:
        return None
    s = sorted(times)
    med = _median(s)
    mad = _median(sorted(abs(x - med) for x in s))
    cutoff = med + 3 * mad + 1e-9 * abs(med)  # float noise must not drop equal steps
    kept = [x for x in s if x <= cutoff]
    return sum(kept) / len(kept)


def _median(s: Sequence[float]) -> float:
    n = len(s)
    h = n >> 1
    return s[h] if n & 1 else (s[h - 1] + s[h]) * 0.5


def merge(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of intervals, sorted."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def redone(steps: Sequence[CohortStep]) -> dict[int, int]:
    """Steps redone, the one definition (goodput's wasted steps, an incident's lost steps):
    {index of a discarded execution: index of the execution that discarded it}.

    An execution is redone when an execution that started after it had ended resumes
    from its step number or an earlier one (a restart from a checkpoint, or an
    in-process restart repeating the step it failed in); it belongs to the first such
    execution, the rollback: from the checkpoint to the fault's step, each execution
    once, whether or not the job has reached its step number again. A restart from
    memory (the next step number) redoes nothing. Only times and step numbers decide:
    two nodes' ranks that disagree on their attempt number (torchrun counts a restart
    on the failed node only) overlap in time and redo nothing of each other."""
    order = sorted(range(len(steps)), key=lambda i: (steps[i].start, steps[i].end))
    running: list[tuple[float, int]] = []  # (end, index): started, not yet ended
    done: list[tuple[int, int]] = []  # (step, index) ended and not discarded, by step
    out: dict[int, int] = {}
    for i in order:
        s = steps[i]
        while running and running[0][0] <= s.start:
            _, j = heapq.heappop(running)
            bisect.insort(done, (steps[j].step, j))
        cut = bisect.bisect_left(done, (s.step, -1))
        for _, j in done[cut:]:
            out[j] = i
        del done[cut:]
        heapq.heappush(running, (s.end, i))
    return out


def world_shares(
    steps: Sequence[CohortStep], worlds: Sequence[tuple[float, int]]
) -> dict[int, float]:
    """{index of a step that ran at a smaller world than the job's largest: w / W}. A
    step's world is that of the newest rank registration at or before its start (the
    ranks of a generation register as it starts: WORLD_SIZE as their launcher gave it);
    W is the largest the job registered with. A step before any registration, or at W,
    is not listed (its share is 1)."""
    if not worlds:
        return {}
    top = max(w for _, w in worlds)
    times = [t for t, _ in worlds]
    out: dict[int, float] = {}
    for i, s in enumerate(steps):
        j = bisect.bisect_right(times, s.start) - 1
        if j >= 0 and worlds[j][1] < top:
            out[i] = worlds[j][1] / top
    return out


def resumption_start(starts: Sequence[float], fault: float, resumed: float) -> float:
    """Where an incident's recovery ends: the start of the step that resumed training.

    `resumed_at` is recorded at the *end* of the first step after the restart (the engine
    and the agents see a completed step), but that step is productive work
    (docs/goodput.md), so recovery ends where it starts: the earliest cohort step start
    (`starts`, sorted) at or after the fault and before `resumed`. The cohort's start is
    its earliest rank's, whichever rank's end `resumed_at` is. No such step in the data:
    `resumed` itself."""
    j = bisect.bisect_left(starts, fault)
    if j < len(starts) and starts[j] < resumed:
        return starts[j]
    return resumed


def account(
    steps: Sequence[CohortStep],
    *,
    job_start: float,
    first_step_start: float | None,
    since: float,
    until: float,
    saves: Sequence[tuple[float, float]] = (),
    restores: Sequence[tuple[float, float]] = (),
    incidents: Sequence[tuple[float, float | None]] = (),
    waiting_since: float | None = None,
    worlds: Sequence[tuple[float, int]] = (),
    points: int = 24,
) -> Accounting:
    """Account [since, until]. `steps` must hold every cohort step that ends in the window
    (earlier ones may be included: they give the first step its start); first_step_start
    is the start of the job's very first step (None: no step yet); waiting_since: the job
    waits for capacity from then on (None: it does not); worlds: (ts, world size) of the
    job's rank registrations over its whole run, oldest first (empty: one size)."""
    since = max(since, job_start)
    until = max(until, since)
    elapsed = until - since
    order = sorted(steps, key=lambda s: (s.end, s.start))

    # Step intervals and their kinds.
    prev_end: dict[tuple[int, int], tuple[int, float]] = {}
    intervals: list[tuple[float, float, int, int]] = []  # (a, b, prio, step index or -1)
    k_of: list[int] = []
    for i, s in enumerate(order):
        gen = (s.attempt, s.iteration)
        p = prev_end.get(gen)
        if p is None:
            a, k = s.start, 1
        else:
            a, k = p[1], max(1, s.step - p[0])
        prev_end[gen] = (s.step, s.end)
        k_of.append(k)
        intervals.append((a, s.end, _STEP, i))
    wasted = set(redone(order))
    intervals = [(a, b, _WASTED if i in wasted else p, i) for a, b, p, i in intervals]

    # Generations and the gaps between them.
    gens: dict[tuple[int, int], list[float]] = {}
    for s in order:
        g = gens.get((s.attempt, s.iteration))
        if g is None:
            gens[(s.attempt, s.iteration)] = [s.start, s.end]
        else:
            if s.start < g[0]:
                g[0] = s.start
            if s.end > g[1]:
                g[1] = s.end
    ends = [s.end for s in order]
    starts = sorted(s.start for s in order)
    incident_spans = []
    for fault, resumed in incidents:
        if resumed is None:
            j = bisect.bisect_right(ends, fault)
            resumed = ends[j] if j < len(ends) else until
        else:
            resumed = resumption_start(starts, fault, resumed)
        incident_spans.append((fault, max(fault, resumed)))
    incident_spans = merge(incident_spans)
    disruptions = []
    by_start = sorted(gens.items(), key=lambda kv: kv[1][0])
    for (_, (_, last_end)), ((att, it), (first_start, _)) in itertools.pairwise(by_start):
        if first_start > last_end:
            intervals.append((last_end, first_start, _RECOVERY, -1))
        covered = any(a <= first_start and b >= last_end for a, b in incident_spans)
        disruptions.append(Disruption(last_end, first_start, att, it, covered))
    intervals += [(a, b, _RECOVERY, -1) for a, b in incident_spans]
    intervals += [(a, b, _SAVE, -1) for a, b in merge(saves)]
    intervals += [(a, b, _RESTORE, -1) for a, b in merge(restores)]
    if waiting_since is not None:
        intervals.append((waiting_since, until, _WAITING, -1))
    if first_step_start is not None and first_step_start > job_start:
        intervals.append((job_start, first_step_start, _INIT, -1))
    elif first_step_start is None:
        intervals.append((job_start, until, _INIT, -1))

    totals, series_raw, step_cov, pieces = _sweep(intervals, since, until, points)

    # Productive vs straggler: each step's time after carve-outs, against the ideal.
    times = [step_cov[i] / k_of[i] for i in step_cov if i not in wasted and step_cov[i] > 0]
    ideal = ideal_step_time(times)
    ratio: dict[int, float] = {}
    for i, cov in step_cov.items():
        if i in wasted or cov <= 0 or ideal is None:
            continue
        ratio[i] = min(cov, k_of[i] * ideal) / cov
    share = world_shares(order, worlds)
    productive = 0.0
    for i, bucket, dt in pieces:
        if i in wasted:
            continue
        good = dt * ratio.get(i, 1.0)
        full = good * share.get(i, 1.0)
        productive += full
        totals["straggler"] += dt - good
        totals["reduced_world"] += good - full
        series_raw[bucket]["productive"] += full
        series_raw[bucket]["straggler"] += dt - good
        series_raw[bucket]["reduced_world"] += good - full
    width = elapsed / points if points else 0.0
    series = []
    for b, row in enumerate(series_raw):
        span = sum(row.values()) - row["waiting"]  # the bar's job time (see Accounting)
        series.append(
            {
                "t": since + b * width,
                "dt": width,
                "goodput": row["productive"] / span if span > 1e-9 else 0.0,
                "productive_s": row["productive"],
                **{k: row[k] for k in BUCKETS},
            }
        )
    in_window = {i for i, _, _ in pieces}
    return Accounting(
        since=since,
        until=until,
        elapsed_s=elapsed,
        productive_s=productive,
        badput={k: totals[k] for k in BUCKETS},
        series=series,
        ideal_step_s=ideal,
        productive_steps=len(in_window - wasted),
        # counted, not timed: a redone step that a recovery or a save covers is one too
        wasted_steps=sum(1 for i in wasted if order[i].end >= since),
        disruptions=disruptions,
    )


def _sweep(
    intervals: list[tuple[float, float, int, int]], since: float, until: float, points: int
) -> tuple[
    dict[str, float], list[dict[str, float]], dict[int, float], list[tuple[int, int, float]]
]:
    """Assign every instant to the highest-priority interval covering it.

    Returns the bucket totals inside [since, until] (steps not yet split), per-series-bucket
    rows, each step's covered time (over all time, so a step cut by the window edge is still
    judged on its whole length) and the in-window pieces of steps (index, bucket, dt)."""
    points = max(1, points)
    width = (until - since) / points
    cuts = [since + b * width for b in range(points)] + [until]
    # (t, +1 open / -1 close / 0 a bar boundary, priority, step index or -1)
    events: list[tuple[float, int, int, int]] = [(c, 0, 0, -1) for c in cuts]
    for a, b, prio, idx in intervals:
        if b > a:
            events.append((a, 1, prio, idx))
            events.append((b, -1, prio, idx))
    events.sort(key=itemgetter(0))
    prio_range = range(_INIT + 1)
    counts = [0] * len(prio_range)
    active: dict[int, int] = {}  # open step intervals: index -> priority (wasted or step)
    totals = dict.fromkeys(BUCKETS, 0.0)
    rows = [dict.fromkeys(("productive", *BUCKETS), 0.0) for _ in range(points)]
    step_cov: dict[int, float] = {}
    pieces: list[tuple[int, int, float]] = []
    bucket = 0
    e, n = 0, len(events)
    while e < n:
        t = events[e][0]
        while e < n and events[e][0] == t:
            _, sign, prio, idx = events[e]
            e += 1
            if sign:
                counts[prio] += sign
                if idx >= 0:
                    if sign > 0:
                        active[idx] = prio
                    else:
                        active.pop(idx, None)
        if e >= n:
            break
        t2 = events[e][0]
        dt = t2 - t
        top = -1
        for p in prio_range:
            if counts[p]:
                top = p
                break
        step_idx = -1
        if top in (_WASTED, _STEP):
            if len(active) == 1:
                step_idx = next(iter(active))
            else:  # overlapping steps (rare): the latest-ending of the winning kind
                step_idx = max(i for i, p in active.items() if p == top)
            step_cov[step_idx] = step_cov.get(step_idx, 0.0) + dt
        if t < since or t2 > until:
            continue
        while bucket < points - 1 and t >= cuts[bucket + 1]:
            bucket += 1
        if step_idx >= 0:
            if top == _WASTED:
                totals["wasted_progress"] += dt
                rows[bucket]["wasted_progress"] += dt
            pieces.append((step_idx, bucket, dt))
            continue
        label = "other" if top < 0 else _PRIO_BUCKET[top]
        totals[label] += dt
        rows[bucket][label] += dt
    return totals, rows, step_cov, pieces
