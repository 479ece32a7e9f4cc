"""Straggler scoring cost: one window of N ranks (default 16,384) through the detector.

Synthetic lockstep steps (1 s +- 5% noise, 1% of the ranks 1.5x slower), fed window by
window; timed separately: feeding a window's step rows into the detector (`add`, the cost
per row the periodic pass pays as rows arrive) and scoring it (`evaluate`: a median per
rank, the cohort reference, the flag state machine). One process, one core, pure Python.
Target: scoring under 100 ms per window for 16,384 ranks.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

from trainguard.backend.analytics.stragglers import StragglerConfig, StragglerDetector


def run(
    ranks: int = 16384,
    window_steps: int = 20,
    windows: int = 8,
    slow_fraction: float = 0.01,
    seed: int = 0,
) -> dict[str, Any]:
    """Returns per-window timings in ms (median and max over `windows` scored windows)
    and what was flagged (the slow ranks after K windows, nobody else)."""
    cfg = StragglerConfig(window_steps=window_steps)
    det = StragglerDetector(cfg)
    det.world_size = ranks
    rng = random.Random(seed)
    slow = set(rng.sample(range(ranks), max(1, int(ranks * slow_fraction))))
    factor = [1.5 if r in slow else 1.0 for r in range(ranks)]
    # Pre-drawn noise, so that drawing random numbers is not part of what is timed.
    noise = [rng.uniform(0.95, 1.05) for _ in range(4096)]
    feed_ms: list[float] = []
    score_ms: list[float] = []
    t0 = 1_700_000_000.0
    flagged: set[int] = set()
    k = 0
    for w in range(windows + 1):  # the last window only closes the one before it
        rows = []
        for n in range(w * window_steps, (w + 1) * window_steps):
            start = t0 + n * 2.0
            for r in range(ranks):
                rows.append((r, n, start, start + factor[r] * noise[k & 4095]))
                k += 1
        t = time.perf_counter()
        add = det.add
        for r, n, a, b in rows:
            add(r, n, a, b)
        feed_ms.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        changes = det.evaluate()
        elapsed = (time.perf_counter() - t) * 1000
        if w > 0:
            score_ms.append(elapsed)
        flagged |= {c.rank for c in changes if c.flagged}
    return {
        "ranks": ranks,
        "window_steps": window_steps,
        "windows": windows,
        "rows_per_window": ranks * window_steps,
        "score_ms_median": statistics.median(score_ms),
        "score_ms_max": max(score_ms),
        "feed_ms_median": statistics.median(feed_ms),
        "feed_us_per_row": statistics.median(feed_ms) * 1000 / (ranks * window_steps),
        "slow_ranks": len(slow),
        "flagged": len(flagged),
        "flagged_exactly_the_slow": flagged == slow,
        "target_ms": 100.0,
        "meets_target": statistics.median(score_ms) < 100.0,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
