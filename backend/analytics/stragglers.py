"""Straggler detection from per-rank step timings: NVRx's scores over windows of steps.

A window is a block of `window_steps` consecutive step numbers within one generation
(attempt, iteration) of the job; windows do not overlap, so K windows are K independent
pieces of evidence. For every rank with at least half a window of steps in it:

- median_step_s: the median of the rank's step durations (end - start) in the window;
- relative score: the cohort's reference step time / the rank's median, where the
  reference is a low quantile of the ranks' medians (default the 10th percentile: NVRx's
  "fastest rank", but robust to a few ranks that are fast because they report wrongly);
- individual score: the rank's own best (lowest) window median / its current median.

A rank is flagged when its relative score stays below `threshold` for `flag_windows`
consecutive scored windows, and unflagged (hysteresis) when it stays at or above
`unflag_threshold` for `unflag_windows` consecutive scored windows. A window with no score
for a rank (it reported too few steps) leaves the rank's counters as they are.

A window is closed (scored) when every rank of its generation (`world_size` ranks, or
the ranks seen when it is unknown) has reached a later window, when a later generation
has started, or `close_after_s` after the first rank moved past it (a dead rank must not
stall scoring; nodes report in separate batches, so one node's steps may arrive a batch
ahead of another's). A new generation (a restart) starts from a clean slate: ranks may be
re-assigned to other processes and nodes, so its flags are cleared.

Pure Python and no I/O: the service feeds step rows and turns transitions into events.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

Gen = tuple[int, int]  # (attempt, iteration)
WindowKey = tuple[int, int, int]  # (attempt, iteration, block)


@dataclass(frozen=True)
class StragglerConfig:
    threshold: float = 0.75
    unflag_threshold: float = 0.85
    window_steps: int = 20
    flag_windows: int = 3
    unflag_windows: int = 3
    reference_quantile: float = 0.1
    close_after_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= self.unflag_threshold:
            raise ValueError("need 0 < threshold <= unflag_threshold")
        if self.window_steps < 2 or self.flag_windows < 1 or self.unflag_windows < 1:
            raise ValueError("need window_steps >= 2, flag_windows >= 1, unflag_windows >= 1")
        if not 0 <= self.reference_quantile <= 0.5:
            raise ValueError("need 0 <= reference_quantile <= 0.5")

    @property
    def min_steps(self) -> int:
        """Steps a rank needs in a window to be scored in it."""
        return max(1, self.window_steps // 2)


@dataclass(slots=True)
class RankState:
    rank: int
    median_step_s: float | None = None
    relative_score: float | None = None
    individual_score: float | None = None
    best_median_s: float | None = None
    below: int = 0  # consecutive scored windows below threshold
    above: int = 0  # consecutive scored windows at or above unflag_threshold
    flagged: bool = False
    flagged_since: float | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """A rank flagged or unflagged; ts is the end of the window that decided it."""

    rank: int
    flagged: bool
    ts: float
    gen: Gen
    relative_score: float | None
    individual_score: float | None
    median_step_s: float | None
    reference_step_s: float | None
    reason: str


@dataclass(slots=True)
class _Window:
    durations: dict[int, list[float]] = field(default_factory=dict)
    end: float = 0.0  # the latest step end seen in it


def score_window(
    durations: Mapping[int, Sequence[float]], min_steps: int, reference_quantile: float
) -> tuple[float | None, dict[int, float]]:
    """(reference step time, {rank: median step time}) of one window; ranks with fewer
    than min_steps durations are left out. The reference is the nearest-rank lower
    quantile of the medians (the fastest rank when there are fewer than 10)."""
    medians: dict[int, float] = {}
    for r, d in durations.items():  # inlined median: this loop runs once per rank
        n = len(d)
        if n < min_steps:
            continue
        s = sorted(d)
        h = n >> 1
        medians[r] = s[h] if n & 1 else (s[h - 1] + s[h]) * 0.5
    if not medians:
        return None, medians
    ordered = sorted(medians.values())
    return ordered[int(reference_quantile * (len(ordered) - 1))], medians


class StragglerDetector:
    """One job's straggler state; feed it step rows with add(), then call evaluate()."""

    def __init__(self, cfg: StragglerConfig) -> None:
        self.cfg = cfg
        self.ranks: dict[int, RankState] = {}
        self.gen: Gen | None = None  # the newest generation seen
        self.reference_step_s: float | None = None
        self.windows_evaluated = 0
        self.last_window_end: float | None = None
        self.late_steps = 0  # steps that arrived after their window was scored
        self.world_size = 0  # ranks expected in a generation (0: the ranks seen)
        self._open: dict[WindowKey, _Window] = {}
        self._reached: dict[Gen, dict[int, int]] = {}  # gen -> rank -> highest block
        self._closed_below: dict[Gen, int] = {}  # gen -> blocks below this are scored
        self._passed_at: dict[WindowKey, float] = {}  # when a first rank moved past it

    def restore(self, rank: int, flagged_since: float, gen: Gen | None) -> None:
        """Put back a flag persisted as an event (after a backend restart)."""
        st = self.ranks.setdefault(rank, RankState(rank))
        st.flagged, st.flagged_since = True, flagged_since
        st.below = self.cfg.flag_windows
        if gen is not None and (self.gen is None or gen > self.gen):
            self.gen = gen

    def add(
        self, rank: int, step: int, start: float, end: float, attempt: int = 0, iteration: int = 0
    ) -> None:
        gen = (attempt, iteration)
        block = step // self.cfg.window_steps
        if block < self._closed_below.get(gen, 0) or (self.gen is not None and gen < self.gen):
            self.late_steps += 1
            return
        key = (attempt, iteration, block)
        w = self._open.get(key)
        if w is None:
            w = self._open[key] = _Window()
        d = w.durations.get(rank)
        if d is None:
            w.durations[rank] = [end - start]
        else:
            d.append(end - start)
        if end > w.end:
            w.end = end
        reached = self._reached.get(gen)
        if reached is None:
            reached = self._reached[gen] = {}
        if reached.get(rank, -1) < block:
            reached[rank] = block

    def add_many(self, rows: Iterable[tuple[int, int, float, float, int, int]]) -> None:
        """rows of (rank, step, start, end, attempt, iteration)."""
        for r in rows:
            self.add(*r)

    def evaluate(self, now: float | None = None) -> list[Transition]:
        """Score every window that is complete; return the flag changes, oldest first.
        `now` is the caller's monotonic clock (for close_after_s)."""
        now = time.monotonic() if now is None else now
        out: list[Transition] = []
        newest = max(self._reached, default=None)
        ready: list[WindowKey] = []
        bounds: dict[Gen, tuple[int, int]] = {}
        for key in self._open:
            gen: Gen = (key[0], key[1])
            if gen != newest:
                ready.append(key)
                continue
            if gen not in bounds:
                reached = self._reached[gen]
                lo = min(reached.values()) if len(reached) >= self.world_size else -1
                bounds[gen] = (lo, max(reached.values()))
            lo, hi = bounds[gen]
            if lo > key[2]:
                ready.append(key)
            elif hi > key[2]:
                passed = self._passed_at.setdefault(key, now)
                if now - passed >= self.cfg.close_after_s:
                    ready.append(key)
        for key in sorted(ready):
            gen = (key[0], key[1])
            if self.gen is None or gen > self.gen:
                out.extend(self._new_generation(gen, self._open[key].end))
            self._score(key, self._open.pop(key), out)
            self._passed_at.pop(key, None)
            self._closed_below[gen] = max(self._closed_below.get(gen, 0), key[2] + 1)
        for gen in [g for g in self._reached if newest is not None and g < newest]:
            self._reached.pop(gen)
            self._closed_below.pop(gen, None)
        return out

    def _new_generation(self, gen: Gen, ts: float) -> list[Transition]:
        """A restart: ranks may now be other processes on other nodes; start afresh."""
        cleared = [
            Transition(st.rank, False, ts, gen, None, None, None, None, "restart")
            for st in self.ranks.values()
            if st.flagged
        ]
        self.ranks = {}
        self.gen = gen
        return cleared

    def _score(self, key: WindowKey, w: _Window, out: list[Transition]) -> None:
        cfg = self.cfg
        ref, medians = score_window(w.durations, cfg.min_steps, cfg.reference_quantile)
        if ref is None:
            return
        gen: Gen = (key[0], key[1])
        self.reference_step_s = ref
        self.windows_evaluated += 1
        self.last_window_end = w.end
        ranks = self.ranks
        threshold, unflag = cfg.threshold, cfg.unflag_threshold
        for rank, med in medians.items():
            st = ranks.get(rank)
            if st is None:
                st = ranks[rank] = RankState(rank)
            rel = ref / med if med > 0 else 1.0
            if st.best_median_s is None or med < st.best_median_s:
                st.best_median_s = med
            st.median_step_s = med
            st.relative_score = rel
            st.individual_score = st.best_median_s / med if med > 0 else 1.0
            st.below = st.below + 1 if rel < threshold else 0
            st.above = st.above + 1 if rel >= unflag else 0
            if not st.flagged and st.below >= cfg.flag_windows:
                st.flagged, st.flagged_since = True, w.end
                out.append(self._transition(st, True, w.end, gen, ref, "slow"))
            elif st.flagged and st.above >= cfg.unflag_windows:
                st.flagged, st.flagged_since = False, None
                out.append(self._transition(st, False, w.end, gen, ref, "recovered"))

    @staticmethod
    def _transition(
        st: RankState, flagged: bool, ts: float, gen: Gen, ref: float, reason: str
    ) -> Transition:
        return Transition(
            st.rank,
            flagged,
            ts,
            gen,
            st.relative_score,
            st.individual_score,
            st.median_step_s,
            ref,
            reason,
        )

    def flagged(self) -> set[int]:
        return {r for r, st in self.ranks.items() if st.flagged}


def node_flags(flagged: set[int], rank_nodes: Mapping[int, str]) -> dict[str, bool]:
    """A node is flagged when every one of its ranks (in this job) is flagged."""
    total: dict[str, int] = {}
    slow: dict[str, int] = {}
    for rank, node in rank_nodes.items():
        total[node] = total.get(node, 0) + 1
        if rank in flagged:
            slow[node] = slow.get(node, 0) + 1
    return {node: slow.get(node, 0) == n for node, n in total.items()}
