"""A synthetic training run whose goodput accounting is known by construction.

Two ranks; times are offsets from T0 (seconds). The cohort step is rank 0's (it starts
first and ends last); rank 1 starts 0.05 s later and ends 0.1 s earlier.

    0 ........ job start (rank_start)
    40-50 .... checkpoint restore before the first step            restore 10
    0-60 ..... initialization (less the restore)                   init 50
    gen (0,0): steps 0..99, 1 s each from 60; save of 2 s after step 49
    162.5 .... incident 1 (fault); steps 50..99 of gen (0,0) are redone later:
               wasted 50 (step 50's interval holds the save, carved out)
    170-175 .. restore 5 s; gen (1,0) starts at step 50 (176-177, the resumption:
               productive work, so recovery ends when it starts)
               recovery 162..176 less the restore = 9
    gen (1,0): steps 51..199, 1 s each, steps 150..159 take 1.5 s (straggler 5);
               save of 3 s after step 149
    334.3 .... incident 2 (in-process, no rollback); gen (1,1) starts at step 200 at 338
               recovery 334..338 = 4
    gen (1,1): steps 200..249, 1 s each, ends at 388; the window ends at 400: other 12
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# A fixed hour a day ago: inside the ingest's 7-day window, and the same all test long.
T0 = float(int(time.time()) // 3600 * 3600 - 86400)
UNTIL = T0 + 400.0

EXPECTED = {
    "initialization": 50.0,
    "checkpoint_save": 5.0,
    "checkpoint_restore": 15.0,
    "recovery": 13.0,
    "wasted_progress": 50.0,
    "straggler": 5.0,
    "other": 12.0,
}
EXPECTED_PRODUCTIVE = 250.0  # 50 (gen 0,0) + 150 (gen 1,0) + 50 (gen 1,1)


@dataclass
class Run:
    # (rank, step, start, end, attempt, iteration)
    steps: list[tuple[int, int, float, float, int, int]] = field(default_factory=list)
    # (ts, phase, step, blocking_s)
    checkpoints: list[tuple[float, str, int, float]] = field(default_factory=list)
    # (fault_at, resumed_at, level, start of the step that resumed training)
    incidents: list[tuple[float, float, str, float]] = field(default_factory=list)
    job_start: float = T0

    def cohort_step(self, step: int, start: float, end: float, gen: tuple[int, int]) -> None:
        self.steps.append((0, step, start, end, *gen))
        self.steps.append((1, step, start + 0.05, end - 0.1, *gen))


def build() -> Run:
    run = Run()
    run.checkpoints.append((T0 + 50, "restore_end", 0, 10.0))
    t = T0 + 60
    for n in range(100):  # gen (0,0)
        run.cohort_step(n, t, t + 1, (0, 0))
        t += 1
        if n == 49:
            run.checkpoints.append((t + 2, "save_end", 49, 2.0))
            t += 2
    assert t == T0 + 162
    run.incidents.append((T0 + 162.5, T0 + 177, "launcher", T0 + 176))
    run.checkpoints.append((T0 + 175, "restore_end", 49, 5.0))
    t = T0 + 176
    for n in range(50, 200):  # gen (1,0), from the checkpoint of step 49
        d = 1.5 if 150 <= n < 160 else 1.0
        run.cohort_step(n, t, t + d, (1, 0))
        t += d
        if n == 149:
            run.checkpoints.append((t + 3, "save_end", 149, 3.0))
            t += 3
    assert t == T0 + 334
    run.incidents.append((T0 + 334.3, T0 + 339, "in_process", T0 + 338))
    t = T0 + 338
    for n in range(200, 250):  # gen (1,1), in-process restart without rollback
        run.cohort_step(n, t, t + 1, (1, 1))
        t += 1
    assert t == T0 + 388
    return run
