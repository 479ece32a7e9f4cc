"""Synchronous training: every rank's wall-clock step waits for the slowest, so only the
compute time the SDK reports (`tg.compute()`) shows which rank is slow."""

from __future__ import annotations

import time
from typing import Any

from tests.support import wait_for
from trainguard.protocol import wire

T0 = float(int(time.time()) // 3600 * 3600 - 86400)


def post_sync_steps(client: Any, job: str, steps: range, compute: dict[int, float] | None) -> None:
    """4 ranks on one node; every step lasts 1.0 s wall-clock on every rank (the
    all-reduce makes them wait for each other); rank 2 computes 1.5x longer."""
    reports = [
        wire.StepReport(
            job=job,
            rank=r,
            step=n,
            start=T0 + n,
            end=T0 + n + 1.0,
            compute=None if compute is None else compute.get(r, 0.6),
        )
        for n in steps
        for r in range(4)
    ]
    ranks = [wire.RankStatus(job=job, rank=r, pid=100 + r, world_size=4) for r in range(4)]
    batch = wire.Batch(
        node="n1",
        agent_id=f"agent-{job}-1",
        seq=steps.start + 1,
        sent_at=time.time(),
        steps=reports,
        ranks=ranks,
    )
    assert client.post("/api/v1/ingest", content=wire.encode(batch)).status_code == 200


def evaluated_since(client: Any, t: float) -> bool:
    """Both jobs' detectors ran after time `t` (so they have seen what was posted)."""
    return all(
        (client.get(f"/api/v1/jobs/{job}/stragglers").json().get("evaluated_at") or 0) > t
        for job in ("with-compute", "wall-clock-only")
    )


def flagged(client: Any, job: str) -> list[int]:
    body = client.get(f"/api/v1/jobs/{job}/stragglers").json()
    return [r["rank"] for r in body["ranks"] if r["flagged"]]


def test_compute_time_finds_the_straggler_that_wall_clock_steps_hide(make_client: Any) -> None:
    client = make_client(
        analytics_interval_s=0.1, straggler_window_steps=10, straggler_flag_windows=2
    )
    # Steps stream in as a live job's would: a window's worth, then the next.
    for start in range(0, 60, 10):
        post_sync_steps(client, "with-compute", range(start, start + 10), {2: 0.9})
        post_sync_steps(client, "wall-clock-only", range(start, start + 10), None)
        posted = time.time()
        wait_for(lambda t=posted: evaluated_since(client, t), 20)
    assert wait_for(lambda: flagged(client, "with-compute"), 20) == [2]
    body = client.get("/api/v1/jobs/with-compute/stragglers").json()
    assert abs(body["ranks"][2]["relative_score"] - 0.6 / 0.9) < 1e-6
    # The same job without compute sections: every rank looks alike, nobody is flagged.
    wait_for(lambda: client.get("/api/v1/jobs/wall-clock-only/stragglers").json()["ranks"], 20)
    assert flagged(client, "wall-clock-only") == []
