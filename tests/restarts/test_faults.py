from __future__ import annotations

import itertools
import threading

import pytest

from tests.support import wait_for
from trainguard import sdk
from trainguard.examples import faults


def test_same_seed_gives_the_same_plan() -> None:
    a = faults.plan(5, 42, 10, 2000, 4)
    assert a == faults.plan(5, 42, 10, 2000, 4)
    assert a != faults.plan(5, 43, 10, 2000, 4)


def test_faults_never_hit_rank_0_and_come_after_the_given_step() -> None:
    for seed in range(50):
        plan = faults.plan(5, seed, 10, 200, 4)
        assert len(plan) == 5
        assert all(f.rank in (1, 2, 3) for f in plan)
        assert all(10 <= f.step < 200 for f in plan)
        assert [f.step for f in plan] == sorted({f.step for f in plan})


def test_kinds_follow_the_weights_given() -> None:
    plan = faults.plan(20, 1, 0, 100, 4, faults.parse_kinds("sigkill"))
    assert {f.kind for f in plan} == {"sigkill"}
    with pytest.raises(ValueError, match="unknown fault kind"):
        faults.parse_kinds("meteor")


def test_min_gap_spaces_the_faults() -> None:
    plan = faults.plan(5, 7, 10, 500, 4, min_gap=40)
    steps = [f.step for f in plan]
    assert all(b - a >= 40 for a, b in itertools.pairwise(steps))


def test_a_fault_fires_once_per_run(tmp_path) -> None:
    plan = [faults.Fault(index=0, step=3, rank=1, kind="exception")]
    inj = faults.Injector(plan, tmp_path)
    inj.before_step(2, 1)
    with pytest.raises(faults.InjectedFault):
        inj.before_step(3, 1)
    # a replay of the step (restart from a checkpoint), even in a new process, does not fire
    faults.Injector(plan, tmp_path).before_step(3, 1)


def test_a_slow_rank_is_slowed_by_its_own_pace_not_compounded(tmp_path, monkeypatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    plan = [faults.Fault(index=0, step=5, rank=1, kind="slow", slow_factor=3.0, slow_steps=3)]
    inj = faults.Injector(plan, tmp_path)
    inj.before_step(4, 1, step_s=0.1)
    for step in range(5, 12):  # step_s is the previous step: slowed ones measure 0.3 s
        inj.before_step(step, 1, step_s=0.3 if 6 <= step <= 9 else 0.1)
    assert slept == pytest.approx([0.2] * 4)


def test_defer_s_goes_to_exception_faults_only_and_changes_no_draw() -> None:
    kinds = faults.parse_kinds("exception,sigkill,hang")
    plain = faults.plan(5, 42, 10, 300, 4, kinds)
    deferred = faults.plan(5, 42, 10, 300, 4, kinds, defer_s=3.0)
    assert [(f.step, f.rank, f.kind) for f in deferred] == [(f.step, f.rank, f.kind) for f in plain]
    assert {f.defer_s for f in deferred if f.kind == "exception"} == {3.0}
    assert {f.defer_s for f in deferred if f.kind != "exception"} == {0.0}
    assert {f.defer_s for f in plain} == {0.0}


def _attached_rank(node, job: str):
    tg = sdk.attach(
        job=job, rank=1, socket_path=node.local.socket_path, install_signal_handler=False
    )
    wait_for(lambda: any(r.job == job for r in node.local.job_ranks(job)), timeout=10)
    return tg


def test_a_deferred_exception_is_reported_then_raised_as_the_agents_restart_request(
    make_node, tmp_path
) -> None:
    node = make_node()
    tg = _attached_rank(node, "jd")
    try:
        plan = [faults.Fault(index=0, step=3, rank=1, kind="exception", defer_s=60.0)]
        inj = faults.Injector(plan, tmp_path / "faults", session=tg)
        asker = threading.Thread(
            target=lambda: (
                wait_for(lambda: node.kinds("exception"), timeout=20),
                node.local.request_restart("jd", "cmd-1", "engine says in_process"),
            )
        )
        asker.start()
        with pytest.raises(sdk.RestartRequested):
            inj.before_step(3, 1)
        asker.join()
        (exc,) = node.kinds("exception")
        assert exc.data["type"] == "InjectedFault"
        raised = wait_for(lambda: [e for e in node.kinds("restart") if e.data["phase"] == "raised"])
        assert raised[0].data["request"] == "cmd-1"
    finally:
        tg.close()


def test_a_deferred_exception_raises_itself_when_no_request_comes(make_node, tmp_path) -> None:
    node = make_node()
    tg = _attached_rank(node, "je")
    try:
        plan = [faults.Fault(index=0, step=3, rank=1, kind="exception", defer_s=0.3)]
        with pytest.raises(faults.InjectedFault):
            faults.Injector(plan, tmp_path / "faults", session=tg).before_step(3, 1)
        assert [e.data["type"] for e in node.kinds("exception")] == ["InjectedFault"]
    finally:
        tg.close()
