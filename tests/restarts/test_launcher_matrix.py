"""The launcher matrix (docs/restarts.md, "The launcher matrix"): real `trainguard server`
and `trainguard agent` processes, real torchrun / ft_launcher jobs with and without NVRx's
Wrapper on one and two imitated nodes, five faults in a row per job (tests/restarts/
matrix.py). Each fault must end in one incident with the right root cause and level,
`resolved` once the job stepped again, or in a 409 that changes nothing; over all of them
the incident invariants hold (tests/invariants.py).

CI runs the user's README script under the README's torchrun line and the demo's
configuration (ft_launcher, Wrapper, two nodes); TRAINGUARD_FULL_MATRIX=1 runs all eight
cells (about 15 minutes on 2 busy cores).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.invariants import check

from .matrix import CAUSES, CELLS, FAULTS, POOL_CELLS, Cell, Outcome, Stack, record

pytestmark = pytest.mark.slow

FULL = os.environ.get("TRAINGUARD_FULL_MATRIX") == "1"
IN_CI = {"ft_launcher-wrapper-2n"}
# torchrun counts a restart only on the node whose workers failed: the Wrapper store's
# generation is keyed on the round's master port alone under the README's line
# (agent/storehost.generation(); tests/agent/test_storehost_generation.py).


def assert_outcomes(stack: Stack, outcomes: list[Outcome]) -> None:
    record(outcomes)
    for o in outcomes:
        if o.expected == "409":
            assert o.status_code == 409, o.line()
            continue
        inc = o.incident
        assert inc is not None, o.line()
        assert inc["job"] == stack.job, o.line()
        assert inc["cause"] in CAUSES[o.fault], o.line()
        if o.fault == "sigkill":  # whatever came first, the killed rank's exit is evidence
            killed = stack.cell.fault_rank("sigkill")
            kinds = {(e["kind"], e["rank"]) for e in inc["evidence"]}
            assert ("rank_exit", killed) in kinds, f"{o.line()}: {sorted(kinds)}"
        assert inc["level"] == o.expected, o.line()
        assert inc["status"] == "resolved", o.line()
        assert inc["recovery_s"] is not None and inc["recovery_s"] > 0, o.line()
        assert o.extra_incidents == [], f"{o.line()}; also {o.extra_incidents}"
    # one job, one name, across every restart of the launcher invocation
    assert [j["name"] for j in stack.get("/jobs")] == [stack.job]
    # one count of lost steps (issue #33, item 5): the incidents' (the steps each one's
    # recovery redid, as GET /incidents/{id} gives them) add up to goodput's wasted steps
    lost = {i["id"]: stack.incident(i["id"])["lost_steps"] for i in stack.incidents()}
    wasted = stack.get(f"/jobs/{stack.job}/goodput")["wasted_steps"]
    print(f"{stack.cell.id}: incidents' lost steps {lost}, goodput wasted_steps {wasted}")
    assert sum(n or 0 for n in lost.values()) == wasted, f"incidents {lost}, goodput {wasted}"
    check(stack.db_url)


def run(stack: Stack, faults: tuple[str, ...]) -> list[Outcome]:
    stack.server()
    stack.agents()
    stack.launch()
    stack.wait_live()
    return [stack.follow(f) for f in faults]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("cell", CELLS, ids=[c.id for c in CELLS])
def test_launcher_matrix(cell: Cell, tmp_path: Path) -> None:
    if cell.id not in IN_CI and not FULL:
        pytest.skip("the full matrix runs with TRAINGUARD_FULL_MATRIX=1")
    stack = Stack(tmp_path, cell)
    try:
        outcomes = run(stack, FAULTS)
        ranks = stack.ranks()
        assert {r["in_process"] for r in ranks if r["alive"]} == {cell.wrapper}
        assert {r["launcher"] for r in ranks if r["alive"]} == {cell.launcher}
        # the launcher's budget, as its workers' environment says (issue 33)
        assert {r["max_restarts"] for r in ranks if r["alive"]} == {stack.max_restarts}
        job = stack.get(f"/jobs/{stack.job}")
        assert job["restarts_left"] == stack.max_restarts - job["restart_count"] >= 1, job
        assert_outcomes(stack, outcomes)
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.close()


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("cell", POOL_CELLS, ids=[c.id for c in POOL_CELLS])
def test_launcher_matrix_with_the_warm_pool(cell: Cell, tmp_path: Path) -> None:
    """Issue 17: the same five faults with the workers started through the shim from the
    agents' warm pools; every launcher restart's new generation is forked warm."""
    stack = Stack(tmp_path, cell)
    try:
        outcomes = run(stack, FAULTS)
        ranks = stack.ranks()
        assert {r["in_process"] for r in ranks if r["alive"]} == {cell.wrapper}
        assert {r["launcher"] for r in ranks if r["alive"]} == {cell.launcher}
        attempts = max(r["attempt"] for r in ranks if r["alive"])
        assert attempts >= 2  # the SIGKILL and the REST launcher restart at least
        # the first generation and every restarted one came from the pools
        assert stack.pool_served() >= cell.world * (attempts + 1)
        assert "trainguard-worker:" not in stack.logs(tail=10**6)  # none fell back to cold
        assert_outcomes(stack, outcomes)
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.close()


@pytest.mark.timeout(900)
def test_a_script_written_from_the_readme_survives_under_the_readme_torchrun_line(
    tmp_path: Path,
) -> None:
    """Done-when of issue 14: examples/train_user.py, under `torchrun --nproc-per-node 2
    --max-restarts 3 --rdzv-backend c10d ...` with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1,
    shows up with no trainguard setting and survives a SIGKILL, an exception and a REST
    launcher restart (three launcher restarts: all --max-restarts 3 allows), each a
    resolved incident; an in-process restart is refused (409), as the job has no Wrapper.
    Issue 33: the REST launcher restart that would use the last of the three is refused
    (409, the budget in words) until it is forced."""
    cell = Cell("torchrun", wrapper=False, nodes=1)
    stack = Stack(tmp_path, cell, max_restarts=3, expect={"rest_launcher": "409"})
    try:
        faults = ("sigkill", "exception", "rest_launcher", "rest_launcher_force", "rest_in_process")
        outcomes = run(stack, faults)
        assert "the launcher allows 3 restarts" in outcomes[2].detail, outcomes[2].detail
        assert stack.get(f"/jobs/{stack.job}")["restarts_left"] == 0
        ranks = [r for r in stack.ranks() if r["alive"]]
        assert {(r["launcher"], r["in_process"]) for r in ranks} == {("torchrun", False)}
        assert {r["node"] for r in ranks} == {"mx-node0"}
        assert {r["attempt"] for r in ranks} == {3}  # three launcher restarts, one job
        logs = stack.logs(tail=10**6)
        assert "no node agent reached" not in logs
        assert "Connection refused" not in logs
        assert_outcomes(stack, outcomes)
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.close()
