"""Straggler detection: a rank 1.5x slower is flagged after K windows and unflagged after
it recovers; noise within 10% flags nobody; flags reach the API, the events and the
node and GPU views through the real ingest."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from tests.support import wait_for
from trainguard.backend.analytics.stragglers import (
    StragglerConfig,
    StragglerDetector,
    Transition,
    node_flags,
    score_window,
)
from trainguard.protocol import wire

# A fixed hour a day ago: inside the ingest's 7-day window, and the same all test long.
T0 = float(int(time.time()) // 3600 * 3600 - 86400)


def feed_windows(
    det: StragglerDetector,
    windows: int,
    ranks: int,
    slow: dict[int, float],
    first_step: int = 0,
    gen: tuple[int, int] = (0, 0),
    noise: float = 0.0,
    rng: random.Random | None = None,
) -> list[tuple[int, list[Transition]]]:
    """Whole windows of lockstep steps; evaluate after every step. Returns (step, changes)."""
    out = []
    w = det.cfg.window_steps
    for n in range(first_step, first_step + windows * w):
        t = T0 + n
        for r in range(ranks):
            d = 0.5 * slow.get(r, 1.0)
            if noise and rng is not None:
                d *= rng.uniform(1 - noise, 1 + noise)
            det.add(r, n, t, t + d, *gen)
        changes = det.evaluate()
        if changes:
            out.append((n, changes))
    return out


def test_a_rank_one_and_a_half_times_slower_is_flagged_after_k_windows() -> None:
    cfg = StragglerConfig(window_steps=10, flag_windows=3, unflag_windows=2)
    det = StragglerDetector(cfg)
    feed_windows(det, 2, 8, {})  # windows 0, 1: all healthy
    changes = feed_windows(det, 5, 8, {5: 1.5}, first_step=20)  # windows 2..6: rank 5 slow
    # Window k is scored once every rank has reached window k+1: window 4 (the third slow
    # one) is scored at step 50, the first step of window 5.
    assert [(n, [(t.rank, t.flagged) for t in ts]) for n, ts in changes] == [(50, [(5, True)])]
    flag = changes[0][1][0]
    assert flag.relative_score == pytest.approx(1 / 1.5)
    assert flag.median_step_s == pytest.approx(0.75)
    assert flag.reference_step_s == pytest.approx(0.5)
    assert flag.ts == pytest.approx(T0 + 49 + 0.75)  # the end of window 4
    assert det.ranks[5].flagged_since == flag.ts
    assert det.ranks[5].individual_score == pytest.approx(1 / 1.5)  # vs its own best window
    assert det.flagged() == {5}
    # Recovery: unflagged after 2 healthy windows (hysteresis), not before.
    changes = feed_windows(det, 4, 8, {}, first_step=70)  # windows 7..10
    assert [(n, [(t.rank, t.flagged) for t in ts]) for n, ts in changes] == [(90, [(5, False)])]
    assert det.flagged() == set() and det.ranks[5].flagged_since is None


def test_scores_between_the_thresholds_keep_the_flag() -> None:
    cfg = StragglerConfig(window_steps=10, flag_windows=2, unflag_windows=2)
    det = StragglerDetector(cfg)
    feed_windows(det, 3, 4, {2: 1.5})
    assert det.flagged() == {2}
    # 1.25x slower: relative 0.8, above 0.75 but below the 0.85 unflag threshold.
    assert feed_windows(det, 4, 4, {2: 1.25}, first_step=30) == []
    assert det.flagged() == {2}
    assert det.ranks[2].below == 0 and det.ranks[2].above == 0


def test_noise_within_ten_percent_flags_nobody() -> None:
    rng = random.Random(20261129)
    det = StragglerDetector(StragglerConfig(window_steps=20, flag_windows=1))
    changes = feed_windows(det, 30, 64, {}, noise=0.10, rng=rng)
    assert changes == []
    assert det.windows_evaluated == 29  # the last window waits for a later one
    scores = [st.relative_score for st in det.ranks.values()]
    assert min(s for s in scores if s is not None) > 0.85


def test_a_restart_clears_the_flags() -> None:
    det = StragglerDetector(StragglerConfig(window_steps=10, flag_windows=2))
    feed_windows(det, 3, 4, {1: 2.0})
    assert det.flagged() == {1}
    changes = feed_windows(det, 2, 4, {}, first_step=10, gen=(1, 0))  # rollback to step 10
    cleared = [t for _, ts in changes for t in ts]
    assert [(t.rank, t.flagged, t.reason, t.gen) for t in cleared] == [
        (1, False, "restart", (1, 0))
    ]
    assert det.flagged() == set()
    # Late steps of the old generation are ignored.
    det.add(1, 35, T0, T0 + 9.0, 0, 0)
    assert det.late_steps == 1


def test_a_dead_rank_does_not_stall_scoring() -> None:
    det = StragglerDetector(StragglerConfig(window_steps=10, flag_windows=2, close_after_s=30))
    feed_windows(det, 1, 4, {})
    for n in range(10, 40):  # rank 3 is gone
        for r in range(3):
            det.add(r, n, T0 + n, T0 + n + (0.9 if r == 2 else 0.5))
    # Windows 1 and 2 wait for rank 3 (its node's batch may just be late), then close.
    assert det.evaluate(now=1000.0) == []
    assert det.evaluate(now=1029.0) == [] and det.windows_evaluated == 0
    assert [t.rank for t in det.evaluate(now=1030.0)] == [2]


def test_score_window_uses_medians_and_a_low_quantile_reference() -> None:
    durations = {r: [1.0] * 9 + [50.0] for r in range(20)}  # one outlier step each
    durations[19] = [2.0] * 10
    ref, med = score_window(durations, min_steps=5, reference_quantile=0.1)
    assert ref == 1.0 and med[0] == 1.0 and med[19] == 2.0
    ref, med = score_window({0: [1.0], 1: [3.0] * 5}, min_steps=5, reference_quantile=0.1)
    assert ref == 3.0 and 0 not in med  # too few steps to be scored


def test_a_node_is_flagged_when_all_its_ranks_are() -> None:
    nodes = {0: "a", 1: "a", 2: "b", 3: "b"}
    assert node_flags({2, 3}, nodes) == {"a": False, "b": True}
    assert node_flags({1, 2}, nodes) == {"a": False, "b": False}


def test_config_fails_fast_on_inconsistent_thresholds() -> None:
    with pytest.raises(ValueError):
        StragglerConfig(threshold=0.9, unflag_threshold=0.8)
    with pytest.raises(ValueError):
        StragglerConfig(window_steps=1)


# --- through the real ingest, the periodic evaluation and the API ------------------------------


def _post(client: Any, node: str, seq: int, **kw: Any) -> None:
    batch = wire.Batch(node=node, agent_id=f"agent-{node}-01", seq=seq, sent_at=time.time(), **kw)
    r = client.post("/api/v1/ingest", content=wire.encode(batch))
    assert r.status_code == 200, r.text


class Job:
    """A 4-rank job on nodes a (ranks 0, 1) and b (ranks 2, 3), one GPU per rank."""

    def __init__(self, client: Any, name: str) -> None:
        self.client, self.name, self.step, self.seq = client, name, 0, 0
        self.placement = {0: ("a", 0), 1: ("a", 1), 2: ("b", 0), 3: ("b", 1)}

    def run(self, steps: int, slow: dict[int, float]) -> None:
        for node in ("a", "b"):
            mine = [r for r, (n, _) in self.placement.items() if n == node]
            reports = [
                wire.StepReport(
                    job=self.name, rank=r, step=n, start=T0 + n, end=T0 + n + 0.5 * slow.get(r, 1)
                )
                for n in range(self.step, self.step + steps)
                for r in mine
            ]
            ranks = [
                wire.RankStatus(job=self.name, rank=r, pid=1000 + r, local_rank=lr, world_size=4)
                for r, (n, lr) in self.placement.items()
                if n == node
            ]
            gpus = [wire.GpuInfo(uuid=f"GPU-{node}-{i}", index=i) for i in (0, 1)]
            self.seq += 1
            _post(self.client, node, self.seq, steps=reports, ranks=ranks, gpus=gpus)
        self.step += steps

    def stragglers(self) -> dict[str, Any]:
        r = self.client.get(f"/api/v1/jobs/{self.name}/stragglers")
        assert r.status_code == 200, r.text
        return r.json()


def _flagged(body: dict[str, Any]) -> list[int]:
    return [r["rank"] for r in body["ranks"] if r["flagged"]]


def _when(read: Any, cond: Any) -> Any:
    """A reader for wait_for: the value read once it meets the condition."""

    def check() -> Any:
        value = read()
        return value if cond(value) else None

    return check


def test_a_slow_rank_is_flagged_then_unflagged_through_the_api(make_client: Any) -> None:
    client = make_client(
        analytics_interval_s=0.1, straggler_window_steps=10, straggler_flag_windows=2
    )
    job = Job(client, "slowrank")
    job.run(20, {})
    job.run(31, {3: 1.5})  # windows 2, 3, 4 slow; window 4 closes at step 50
    body = wait_for(_when(job.stragglers, _flagged), 20)
    assert body["threshold"] == 0.75 and body["window_steps"] == 10
    assert _flagged(body) == [3]
    r3 = body["ranks"][3]
    assert r3["node"] == "b" and r3["gpu_uuid"] == "GPU-b-1"
    assert r3["relative_score"] == pytest.approx(1 / 1.5)
    assert r3["median_step_s"] == pytest.approx(0.75)
    assert r3["flagged_since"] == pytest.approx(T0 + 39 + 0.75)  # end of window 3 (K = 2)
    assert body["ranks"][0]["flagged"] is False and body["ranks"][0]["relative_score"] == 1.0
    assert {n["node"]: n["flagged"] for n in body["nodes"]} == {"a": False, "b": False}
    events = client.get("/api/v1/events", params={"kind": "straggler"}).json()
    assert [(e["rank"], e["node"], e["data"]["flagged"]) for e in events] == [(3, "b", True)]
    assert events[0]["gpu_uuid"] == "GPU-b-1" and events[0]["data"]["score"] < 0.75
    node_view = client.get("/api/v1/nodes/b/stragglers").json()
    assert node_view["flagged"] is False
    assert [r["rank"] for r in node_view["jobs"][0]["ranks"]] == [3]
    assert [g["uuid"] for g in node_view["gpus"] if g["flagged"]] == ["GPU-b-1"]
    # Recovery: two healthy windows unflag it.
    job.run(30, {})
    wait_for(lambda: _flagged(job.stragglers()) == [], 20)
    events = client.get("/api/v1/events", params={"kind": "straggler"}).json()
    assert [e["data"]["flagged"] for e in events] == [False, True]  # newest first


def test_a_node_whose_ranks_are_all_slow_is_flagged(make_client: Any) -> None:
    client = make_client(
        analytics_interval_s=0.1, straggler_window_steps=10, straggler_flag_windows=2
    )
    job = Job(client, "slownode")
    job.run(41, {2: 1.6, 3: 1.6})
    body = wait_for(_when(job.stragglers, lambda b: len(_flagged(b)) == 2), 20)
    assert _flagged(body) == [2, 3]
    nodes = {n["node"]: n for n in body["nodes"]}
    assert nodes["b"]["flagged"] is True and nodes["a"]["flagged"] is False
    assert sorted(nodes["b"]["gpus"]) == ["GPU-b-0", "GPU-b-1"]
    view = wait_for(
        _when(lambda: client.get("/api/v1/nodes/b/stragglers").json(), lambda v: v["flagged"])
    )
    assert view["jobs"][0]["node_flagged"] is True
    assert client.get("/api/v1/nodes/nope/stragglers").status_code == 404
    assert client.get("/api/v1/jobs/nope/stragglers").status_code == 404
    metrics = wait_for(
        lambda: 'trainguard_job_stragglers{job="slownode"} 2.0' in client.get("/metrics").text
    )
    assert metrics


def test_flags_survive_a_backend_restart(make_client: Any) -> None:
    settings = {
        "analytics_interval_s": 0.1,
        "straggler_window_steps": 10,
        "straggler_flag_windows": 2,
        "straggler_unflag_windows": 2,
    }
    first = make_client(**settings)
    job = Job(first, "restarted")
    job.run(41, {1: 1.5})
    wait_for(_when(job.stragglers, lambda b: _flagged(b) == [1]), 20)
    first.__exit__(None, None, None)  # the backend stops; the flag is an event row
    second = make_client(**settings)
    job.client = second
    body = job.stragglers()
    assert _flagged(body) == [1] and body["ranks"][1]["flagged_since"] is not None
    # The new process picks the flag up and unflags the rank once it is fast again.
    job.run(40, {})
    wait_for(_when(job.stragglers, lambda b: _flagged(b) == []), 20)
    events = second.get("/api/v1/events", params={"kind": "straggler"}).json()
    assert [e["data"]["flagged"] for e in events] == [False, True]


def test_the_benchmark_flags_exactly_the_slow_ranks() -> None:
    from trainguard.backend.bench.stragglers import run

    out = run(ranks=256, window_steps=10, windows=4, slow_fraction=0.05)
    assert out["flagged_exactly_the_slow"] and out["slow_ranks"] == 12
    assert out["rows_per_window"] == 2560 and out["score_ms_median"] > 0
