"""The launcher's restart budget with a real launcher (docs/engine.md, "The launcher's
restart budget"): examples/train_user.py under torchrun `--max-restarts 1`, a real
`trainguard server` and `trainguard agent` (tests/restarts/matrix.py). The job shows one
restart left; a manual launcher restart, which would use it, is refused with 409 and the
budget in words, and changes nothing; forced, it restarts the job and nothing is left."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import wait_for

from .matrix import Cell, Stack

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_torchrun_with_one_restart_refuses_to_spend_it_without_force(tmp_path: Path) -> None:
    cell = Cell("torchrun", wrapper=False, nodes=1)
    stack = Stack(tmp_path, cell, max_restarts=1, expect={"rest_launcher": "409"})
    with stack.running():
        stack.wait_live()
        job = stack.get(f"/jobs/{stack.job}")
        assert (job["max_restarts"], job["restart_count"], job["restarts_left"]) == (1, 0, 1)
        assert {(r["max_restarts"], r["restart_count"]) for r in job["ranks"]} == {(1, 0)}

        refused = stack.follow("rest_launcher")  # asserts: no incident, the same pids
        assert refused.status_code == 409
        for words in ("allows 1 restarts", "has used 0", "--max-restarts", "force: true"):
            assert words in refused.detail, refused.detail

        forced = stack.follow("rest_launcher_force")
        assert forced.incident is not None, forced.line()
        assert (forced.incident["level"], forced.incident["status"]) == ("launcher", "resolved")
        job = stack.get(f"/jobs/{stack.job}")
        assert (job["restart_count"], job["restarts_left"]) == (1, 0)


@pytest.mark.timeout(300)
def test_a_launcher_that_gives_up_leaves_its_incident_failed_with_the_reason(
    tmp_path: Path,
) -> None:
    """torchrun `--max-restarts 0`: a SIGKILLed rank ends the job (the launcher cannot
    re-form the group). The incident, held for an operator (no restart left), never reads
    resolved: once the job is failed (no new generation within relaunch_wait_s, 10 s here)
    it ends failed and says the launcher gave up (issue #32, item 4)."""
    cell = Cell("torchrun", wrapper=False, nodes=1)
    stack = Stack(tmp_path, cell, max_restarts=0, policy="[escalation]\nrelaunch_wait_s = 10\n")
    with stack.running():
        ranks = stack.wait_live()
        assert stack.get(f"/jobs/{stack.job}")["restarts_left"] == 0
        stack.fault("sigkill", ranks)
        wait_for(lambda: all(p.poll() is not None for p in stack.launchers), 120, 0.5)
        assert stack.launchers[0].returncode != 0  # the launcher gave up

        def ended() -> tuple[list[dict], dict] | None:
            incs, job = stack.incidents(), stack.get(f"/jobs/{stack.job}")
            done = incs and all(i["status"] == "failed" for i in incs)
            return (incs, job) if done and job["state"] == "failed" else None

        incs, job = wait_for(ended, 120, 0.5)
        assert all(i["status"] != "resolved" for i in incs)
        assert any("launcher" in i["outcome"] for i in incs), incs
        assert job["ended_at"] is not None
