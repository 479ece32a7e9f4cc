"""The recovery bench's mode set-up, its reading of the agents' step reports and of the
engine's incidents (pure functions on synthetic records; the timed runs are
`trainguard bench recovery`, docs/benchmarks-recovery.md)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from trainguard.backend.bench import recovery
from trainguard.backend.bench.recovery_analysis import analyse
from trainguard.backend.bench.recovery_engine import (
    decisions_per_fault,
    decisions_table,
    who_reacted,
)
from trainguard.protocol.wire import Event, StepReport

T = 1_800_000_000.0


def test_the_mixed_plan_keeps_the_steps_and_ranks_and_mixes_the_kinds() -> None:
    single = recovery.fault_plan("baseline", 5, 42, 10, 300)
    plans = {m: recovery.fault_plan(m, 5, 42, 10, 300) for m in recovery.MIXED_MODES}
    mixed = plans["engine"]
    assert all(p == mixed for p in plans.values())  # identical across the compared runs
    assert [(f.step, f.rank) for f in mixed] == [(f.step, f.rank) for f in single]
    assert [f.kind for f in mixed] == ["sigkill", "sigkill", "exception", "exception", "hang"]


def test_only_the_engine_mode_defers_exceptions_to_trainguard() -> None:
    kw = {m: recovery.launch_kwargs(m, 5) for m in recovery.ALL_MODES}
    assert kw["engine"]["extra_args"] == ["--fault-defer-s", "3.0"]
    assert "extra_args" not in kw["engine_after_nvrx"]
    assert "extra_args" not in kw["mixed_nvrx"]
    # the fixed modes: no Wrapper, so nothing restarts in process
    assert kw["mixed_baseline"] == {**kw["baseline"], "fault_kinds": recovery.MIXED_KINDS}
    assert kw["mixed_launcher"]["extra_args"] == ["--no-wrapper"]
    assert kw["mixed_launcher"]["max_restarts"] == 7
    # the single-kind modes as they were measured
    assert kw["launcher"] == {"fault_kinds": "sigkill", "max_restarts": 7}
    assert kw["in_process"] == {"fault_kinds": "exception"}
    assert recovery.launch_kwargs("engine", 5, engine_defer_s=0).get("extra_args") is None
    with pytest.raises(ValueError, match="unknown mode"):
        recovery.launch_kwargs("always_in_process", 5)


def _steps(
    ranks: range | tuple[int, ...], steps: range, first_start: float, attempt: int
) -> list[Any]:
    """Lock-step 0.5 s steps of `ranks`, the first of `steps` starting at `first_start`."""
    return [
        StepReport(
            job="bench",
            rank=r,
            step=n,
            start=first_start + 0.5 * (n - steps[0]),
            end=first_start + 0.5 * (n - steps[0] + 1),
            attempt=attempt,
        )
        for n in steps
        for r in ranks
    ]


def _fault(ts: float, index: int, rank: int, step: int) -> Any:
    msg = f"injecting fault {index}: sigkill on rank {rank} at step {step}"
    return Event(kind="log", ts=ts, job="bench", rank=rank, message=msg)


def test_a_step_redone_after_a_launcher_restart_counts_only_its_last_execution() -> None:
    """Two SIGKILLs under ft_launcher (4 ranks, node0 = ranks 0-1, node1 = ranks 2-3), the
    second while the first's redo is still within the SDK's 1 s send interval: the killed
    rank and its node-mate lose their reports of the redone steps 5-7. The old analysis took
    each rank's own last execution of a step and merged them over the ranks, so steps 5-7
    ran from generation 0's start (ranks 0-1) to generation 1's end (ranks 2-3), 9.5 s each
    across the restart: 37 s of productive time in 29 s of wall time (127.6 %)."""
    steps = (
        _steps(range(4), range(0, 8), T + 1, attempt=0)  # fault 0 at step 8, resume at 4
        + _steps(range(2, 4), range(4, 12), T + 12, attempt=1)  # fault 1 at 12, resume at 8
        + _steps(range(2), range(4, 5), T + 12, attempt=1)  # node0: only the first step came
        + _steps(range(4), range(8, 20), T + 22, attempt=2)
    )
    events = [_fault(T + 5.0, 0, 2, 8), _fault(T + 16.0, 1, 1, 12)]
    out = analyse(SimpleNamespace(steps=steps, events=events), T, T + 29)
    # 20 steps of 0.5 s, each once: steps 0-3 of generation 0, 4-7 of 1, 8-19 of 2
    assert out["productive_s"] == 10.0
    assert out["wall_s"] == 29.0
    assert out["train_span_s"] == 27.0
    assert out["efficiency"] == round(10 / 29, 4) == 0.3448
    assert out["efficiency_span"] == round(10 / 27, 4) == 0.3704
    assert out["steps_done"] == 20
    assert out["step_median_s"] == 0.5
    assert [f["recovery_s"] for f in out["per_fault"]] == [7.5, 6.5]
    assert out["wasted_steps"] == 8


def test_steps_of_skewed_ranks_overlap_and_count_once() -> None:
    """Rank 1 runs 0.25 s behind rank 0 (descheduled on a shared core): rank 0 starts step
    n + 1 while rank 1 finishes step n. Summed per step, the 10 steps made 7.5 s of
    productive time in a 5.25 s training span (143 %); covered once, 5.25 s."""
    steps = _steps((0,), range(10), T + 1, attempt=0) + _steps((1,), range(10), T + 1.25, 0)
    out = analyse(SimpleNamespace(steps=steps, events=[]), T, T + 7, world=2)
    assert out["productive_s"] == 5.25
    assert out["train_span_s"] == 5.25
    assert out["efficiency_span"] == 1.0
    assert out["efficiency"] == 0.75
    assert out["step_median_s"] == 0.75


def _cmd(cid: str, node: str, action: str, issued: float, *acks: tuple[str, float, str]) -> Any:
    return {
        "id": cid,
        "node": node,
        "action": action,
        "issued_at": issued,
        "acks": [{"phase": p, "ts": ts, "detail": d} for p, ts, d in acks],
    }


def _incident(iid: int, fault_at: float, decisions: list[str], commands: list[Any], **kw: Any):
    tl = {
        "fault_at": fault_at,
        "detected_at": fault_at + 0.02,
        "decided_at": fault_at + 0.05,
        "delivered_at": fault_at + 0.08,
        "torn_down_at": None,
        "restarted_at": None,
        "resumed_at": kw.pop("resumed_at", None),
    }
    return {
        "id": iid,
        "cause": kw.pop("cause", "exception"),
        "level": decisions[-1],
        "status": kw.pop("status", "resolved"),
        "outcome": "resumed",
        "escalations": len(decisions) - 1,
        "timeline": tl,
        "decisions": [{"level": lv} for lv in decisions],
        "commands": commands,
        "evidence": kw.pop("evidence", []),
    }


def test_each_incident_is_read_as_the_levels_chosen_for_its_fault_and_who_restarted() -> None:
    fired = [(T + 10, 0, 1, 22), (T + 40, 1, 3, 124), (T + 50, 2, 2, 135)]
    kinds = {0: "sigkill", 1: "exception", 2: "exception"}
    incidents = [
        _incident(  # a SIGKILL: the launcher had ended the workers before the command came
            1,
            T + 10.01,
            ["launcher", "exclude_node", "stop_job"],
            [
                _cmd("a", "node0", "launcher", T + 10.3, ("failed", T + 10.6, "no live rank")),
                _cmd("b", "node1", "launcher", T + 10.3, ("failed", T + 10.7, "no live rank")),
            ],
            cause="rank_exit",
            status="stopped",
            evidence=[{"kind": "rank_exit", "ts": T + 10.01}],
        ),
        _incident(
            2,
            T + 40.002,
            ["in_process"],
            [_cmd("c", "node1", "in_process", T + 40.05, ("torn_down", T + 40.1, ""))],
            resumed_at=T + 41.5,
        ),
        _incident(
            3,
            T + 50.003,
            ["in_process"],
            [
                _cmd(
                    "d",
                    "node0",
                    "in_process",
                    T + 50.9,
                    ("torn_down", T + 50.2, "already restarted in process (iteration 2)"),
                )
            ],
        ),
        _incident(4, T + 5, ["in_process"], []),  # evidence before any fault
    ]
    rep = decisions_per_fault(fired, kinds, incidents, raised={"c"})
    f0, f1, f2 = rep["faults"]
    assert f0["incidents"][0]["levels"] == ["launcher", "exclude_node", "stop_job"]
    assert f0["incidents"][0]["who"].startswith("ft_launcher by itself")
    assert f1["incidents"][0]["who"].startswith("engine:")
    assert f1["incidents"][0]["resumed_s"] == 1.5
    assert f1["incidents"][0]["decide_ms"] == 30.0
    assert f2["incidents"][0]["who"].startswith("NVRx Wrapper by itself")
    assert rep["unmatched_incidents"] == [{"id": 4, "cause": "exception", "level": "in_process"}]
    text = decisions_table(rep)
    assert "launcher -> exclude_node -> stop_job (stopped)" in text
    assert "no fault (incident 4" in text


def test_a_launcher_command_without_a_death_before_it_is_the_engines_restart() -> None:
    inc = _incident(
        1,
        T,
        ["in_process", "launcher"],
        [
            _cmd("a", "node0", "in_process", T + 0.1, ("failed", T + 60, "no rank raised")),
            _cmd("b", "node0", "launcher", T + 1.0, ("torn_down", T + 1.2, "ended 2 worker(s)")),
        ],
        evidence=[{"kind": "hang", "ts": T}, {"kind": "rank_exit", "ts": T + 1.1}],
    )
    assert who_reacted(inc, raised=set()) == (
        "engine: its launcher command ended the workers; its SIGTERM ended 2 worker(s) on node0"
    )


def test_the_warm_launcher_mode_is_the_launcher_mode_through_the_shim() -> None:
    cold, warm = recovery.launch_kwargs("launcher", 5), recovery.launch_kwargs("launcher_warm", 5)
    assert warm == {**cold, "shim": True}
    assert recovery.fault_plan("launcher_warm", 5, 42, 10, 300) == recovery.fault_plan(
        "launcher", 5, 42, 10, 300
    )


def test_the_phases_of_a_launcher_restart_come_from_the_agents_and_the_launcher_logs() -> None:
    from datetime import datetime

    from trainguard.backend.bench.recovery_analysis import recovery_phases, rendezvous_rounds

    def ev(kind: str, at: float, **data: Any) -> Any:
        return Event(kind=kind, ts=T + at, job="bench", data=data)

    joined = datetime.fromtimestamp(T + 11).strftime("%Y-%m-%d %H:%M:%S")
    logs = [
        f"[{joined},250] [INFO] [ft_launcher1@vm] The node 'n0' has joined round 1 of the "
        "rendezvous 'bench' as rank 0 in a world of size 2.\n"
        "[2026-01-01 00:00:00,000] [INFO] [x] The node 'n0' has joined round 0 of the rendezvous",
    ]
    rounds = rendezvous_rounds(logs)
    assert rounds == [T + 11.25]
    events = [
        _fault(T + 10.0, 0, 1, 8),
        ev("rank_exit", 10.2),
        ev("rank_exit", 10.9),
        ev("rank_start", 12.0, pid=101),
        ev("rank_start", 12.3, pid=102),
        ev("checkpoint", 13.0, phase="restore_start"),
        ev("checkpoint", 13.1, phase="restore_end"),
    ]
    nodes = SimpleNamespace(
        events=events, steps=[], proc_starts={101: T + 11.8, 102: T + 9.0}, entered={102: T + 12.6}
    )
    per_fault = [{"index": 0, "recovered": True, "recovery_s": 3.2}]
    (ph,) = recovery_phases(nodes, per_fault, rounds)
    assert ph["old_gone_s"] == 0.9
    assert ph["rendezvous_s"] == 1.25
    assert ph["spawned_s"] is None  # one new worker was forked before the fault: warm
    assert ph["attached_s"] == 2.3
    assert ph["entered_s"] == 2.6
    assert (ph["restore_start_s"], ph["restore_end_s"], ph["recovery_s"]) == (3.0, 3.1, 3.2)
    assert recovery_phases(nodes, [{"index": 0, "recovered": False}], rounds) == []
