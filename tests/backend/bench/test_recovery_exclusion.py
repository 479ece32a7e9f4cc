"""The recovery bench's exclusion modes (backend/bench/recovery_exclusion.py): their job
layouts, the reading of a fault that does not stop the ranks (synthetic records), and one
real exclusion onto a hot spare (a `trainguard server`, three agents, three ft_launchers,
gloo on CPU)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trainguard.backend import demojob
from trainguard.backend.bench import recovery, recovery_exclusion, recovery_exclusion_tables
from trainguard.backend.bench.recovery_analysis import analyse
from trainguard.protocol.wire import StepReport

T = 1_800_000_000.0


def _steps(ranks: range, steps: range, first_start: float) -> list[Any]:
    """Lock-step 0.5 s steps of `ranks`, the first of `steps` starting at `first_start`."""
    return [
        StepReport(
            job="bench",
            rank=r,
            step=n,
            start=first_start + 0.5 * (n - steps[0]),
            end=first_start + 0.5 * (n - steps[0] + 1),
        )
        for n in steps
        for r in ranks
    ]


def test_the_spare_waits_beyond_nnodes_and_the_shrink_is_elastic() -> None:
    spare = recovery.launch_kwargs("exclude_spare", 3)
    shrink = recovery.launch_kwargs("exclude_shrink", 3)
    for kw in (spare, shrink):
        # as launcher_warm (the warm pool through the shim), the rendezvous on the bench's
        # store so that any node may leave, no Wrapper
        assert (kw["shim"], kw["rdzv_host"], kw["extra_args"]) == (True, False, ["--no-wrapper"])
        assert kw["nnodes"] == 2
    assert recovery_exclusion.LAYOUTS["exclude_spare"].nodes == 3
    assert spare["spare_delay_s"] == recovery_exclusion.SPARE_DELAY_S
    assert "min_nodes" not in spare
    assert recovery_exclusion.LAYOUTS["exclude_shrink"].nodes == 2
    assert shrink["min_nodes"] == 1 and "spare_delay_s" not in shrink
    line = demojob.launcher_command(2, 2, 29500, "bench", 3, [], min_nodes=1, rdzv_host=False)
    assert line[line.index("--nnodes") + 1] == "1:2"
    assert line[line.index("--rdzv-conf") + 1] == "is_host=0"
    assert recovery.FAULT_KIND["exclude_spare"] == recovery.FAULT_KIND["exclude_shrink"] == "xid"


def test_the_old_generation_training_on_past_an_xid_is_not_the_recovery() -> None:
    """XID 79 at T + 5 on node1 (ranks 2-3): every rank trains on until the exclusion ends
    the workers (steps 10-11 finish after the fault); the job re-forms on node0 alone, whose
    new workers attach at T + 20 and resume from the checkpoint at step 8 with 2 ranks."""
    steps = _steps(range(4), range(0, 12), T + 0.0) + _steps(range(2), range(8, 30), T + 20.5)
    nodes = SimpleNamespace(steps=steps, events=[])
    fired = [(T + 5.0, 0, 3, 9)]
    naive = analyse(nodes, T, T + 40, fired=fired, resume_world=2)
    assert naive["per_fault"][0]["recovery_s"] == 1.0  # step 11 of the old generation
    out = analyse(nodes, T, T + 40, fired=fired, resumed_after={0: T + 20.0}, resume_world=2)
    (f,) = out["per_fault"]
    assert (f["recovered"], f["recovery_s"], f["resumed_at_step"]) == (True, 16.0, 8)
    assert f["wasted_steps"] == 1
    # without the shrunk world, the 2 ranks left are not a recovered job of 4
    full = analyse(nodes, T, T + 40, fired=fired, resumed_after={0: T + 20.0})
    assert full["faults_recovered"] == 0


def test_the_exclusion_phases_are_read_per_fault_and_as_medians() -> None:
    rows = [
        {"decided_s": 0.03, "left_s": 0.5, "rendezvous_s": 1.5, "recovery_s": 2.0},
        {"decided_s": 0.05, "left_s": None, "rendezvous_s": 2.5, "recovery_s": 3.0},
    ]
    table = recovery_exclusion_tables.phases_table([("exclude_spare", rows)])
    assert table.splitlines()[2].startswith("| exclude_spare | 0.04 | 0.50 | - | 2.00 | - | - |")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_xid_79_on_a_node_excludes_it_and_the_spare_takes_its_place(tmp_path: Path) -> None:
    out = recovery.run_mode("exclude_spare", faults=1, workdir=tmp_path)
    assert out["completed"], (out["error"], (tmp_path / "exclude_spare" / "log_tail.txt"))
    assert (out["faults_fired"], out["faults_recovered"]) == (1, 1)
    (f,) = out["phases"]
    assert (f["cause"], f["level"], f["status"]) == ("xid 79", "exclude_node", "resolved")
    assert f["leave"].startswith(f"{f['node']} left: ended pid"), f
    # the node left, then the round re-formed, then the job stepped again
    assert 0 < f["decided_s"] <= f["left_s"] <= f["rendezvous_s"] < f["recovery_s"], f
    (per,) = out["per_fault"]
    assert per["recovery_s"] == f["recovery_s"]
    # from a checkpoint (every 20 steps), which may be one the old generation saved after
    # the XID: it trains on until the exclusion ends it
    assert per["resumed_at_step"] > 0 and per["resumed_at_step"] % 20 == 0, per
