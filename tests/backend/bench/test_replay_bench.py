"""`trainguard bench replay`: the synthetic period replays one incident per fault, each
decided at the level its kind calls for (speed is the bench's to report, not asserted)."""

from __future__ import annotations

from trainguard.backend.bench.replay import run, synthesize


def test_the_synthetic_period_is_one_incident_per_fault() -> None:
    tr = synthesize(12, 3, 60.0, seed=7)
    assert len({e["id"] for e in tr["event"]}) == len(tr["event"])
    assert sorted(e["received_at"] for e in tr["event"]) == [e["received_at"] for e in tr["event"]]
    faults = [e for e in tr["event"] if e["kind"] != "rank_start"]
    assert len(faults) == 12
    out = run(12, 3, 60.0, seed=7)
    assert out["incidents_replayed"] == 12
    launcher = sum(1 for e in faults if e["kind"] == "rank_exit")
    assert out["by_level"].get("launcher", 0) == launcher
    assert out["by_level"].get("in_process", 0) == 12 - launcher
    assert out["cycles"] > 0 and out["peak_rss_mib"] > 0
