"""Job states follow the job, with real launchers (docs/engine.md, "Job states"): a
`trainguard server`, `trainguard agent` per imitated node and the job under torchrun or
ft_launcher (tests/restarts/matrix.py).

- A job its user stops (SIGTERM to its launcher, or Ctrl-C: SIGINT to the launcher's
  process group) ends `stopped`, "ended by a signal from outside", with no incident and
  no alert; started again under the same run id it is `running` again.
- stop_job ends the job through its launcher: the agent sends it SIGTERM, the launcher
  exits, and the job ends `stopped` saying so, audited.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests.invariants import check
from tests.support import wait_for

from .matrix import Cell, Stack

pytestmark = pytest.mark.slow

OUTSIDE = "ended by a signal from outside"


def ended(stack: Stack) -> dict[str, Any] | None:
    """The job once it ended (a final state with its end time), else None."""
    job = stack.get(f"/jobs/{stack.job}")
    return job if job["ended_at"] is not None and job["state"] != "running" else None


def launchers_gone(stack: Stack, timeout: float = 90) -> None:
    wait_for(lambda: all(p.poll() is not None for p in stack.launchers), timeout, 0.3)


@pytest.mark.timeout(420)
@pytest.mark.parametrize(
    ("cell", "how"),
    [
        (Cell("torchrun", wrapper=False, nodes=1), "sigterm"),
        (Cell("torchrun", wrapper=False, nodes=1), "ctrl_c"),
        (Cell("ft_launcher", wrapper=False, nodes=2), "sigterm"),
    ],
    ids=["torchrun-sigterm", "torchrun-ctrl_c", "ft_launcher-2n-sigterm"],
)
def test_a_job_its_user_stops_ends_stopped_with_no_incident(
    tmp_path: Path, cell: Cell, how: str
) -> None:
    stack = Stack(tmp_path, cell)
    try:
        stack.server()
        stack.agents()
        stack.launch()
        stack.wait_live()
        for p in stack.launchers:
            if how == "sigterm":
                os.kill(p.pid, signal.SIGTERM)  # kill, scancel, a deleted pod
            else:
                os.killpg(p.pid, signal.SIGINT)  # Ctrl-C: the terminal's whole group
        launchers_gone(stack)
        job = wait_for(lambda: ended(stack), 60, 0.5)
        assert job["state"] == "stopped", job
        assert OUTSIDE in job["state_reason"], job
        # The held exits (the agent waits for the launcher's) are in, and made nothing.
        exits = stack.get("/events", job=stack.job, kind="rank_exit")
        assert len(exits) >= cell.world
        assert all(e["data"].get("launcher_exited") is True for e in exits), exits
        assert stack.incidents() == []
        assert "ALERT" not in stack.logs(tail=10**6)
        # Started again under the same run id: the same job runs again.
        stack.launchers.clear()
        stack.launch()
        stack.wait_live(after=time.time())
        job = stack.get(f"/jobs/{stack.job}")
        assert (job["state"], job["ended_at"]) == ("running", None), job
        check(stack.db_url)
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.close()


@pytest.mark.timeout(300)
def test_stop_job_ends_the_job_through_its_launcher(tmp_path: Path) -> None:
    """A policy that gives a job up on its first exception: the engine decides stop_job,
    the agent ends torchrun with SIGTERM (torchrun would otherwise restart the workers,
    --max-restarts 6), and the job ends `stopped` with what was done, audited."""
    cell = Cell("torchrun", wrapper=False, nodes=1)
    stack = Stack(tmp_path, cell, policy='[causes]\nexception = "stop_job"\n')
    try:
        stack.server()
        stack.agents()
        stack.launch()
        ranks = stack.wait_live()
        stack.fault("exception", ranks)
        launchers_gone(stack)
        job = wait_for(lambda: ended(stack), 60, 0.5)
        (inc,) = stack.incidents()
        assert (inc["status"], inc["level"]) == ("stopped", "stop_job"), inc
        assert job["state"] == "stopped", job
        node = inc["commands"][0]["node"]
        assert job["state_reason"] == (
            f"incident {inc['id']}: policy causes.exception; "
            f"trainguard ended its launcher on {node}"
        ), job
        assert [(c["action"], c["node"]) for c in inc["commands"]] == [("stop_job", node)]
        phases = [a["phase"] for a in stack.incident(inc["id"])["commands"][0]["acks"]]
        assert phases == ["delivered", "torn_down"], phases
        with sqlite3.connect(stack.db_url.removeprefix("sqlite:///")) as db:
            audit = db.execute(
                "SELECT actor, action, target, reason FROM audit_log WHERE action = 'stop_job'"
            ).fetchall()
        assert audit == [
            (
                "engine",
                "stop_job",
                f"job:{stack.job}",
                f"incident {inc['id']}: policy causes.exception",
            )
        ], audit
        check(stack.db_url)
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.close()


@pytest.mark.timeout(300)
def test_a_job_whose_ranks_exit_0_is_finished(tmp_path: Path) -> None:
    """torchrun, 60 steps: every rank exits 0, the launcher exits 0, the job is
    `finished` ("every rank exited 0") with no incident."""
    stack = Stack(tmp_path, Cell("torchrun", wrapper=False, nodes=1), steps=60)
    try:
        stack.server()
        stack.agents()
        stack.launch()
        launchers_gone(stack, timeout=180)
        assert [p.returncode for p in stack.launchers] == [0]
        job = wait_for(lambda: ended(stack), 60, 0.5)
        assert (job["state"], job["state_reason"]) == ("finished", "every rank exited 0"), job
        assert job["last_step"] == 59, job
        assert stack.incidents() == []
        check(stack.db_url)
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.close()


@pytest.mark.timeout(420)
def test_a_job_whose_only_node_is_excluded_waits_and_restarts_when_it_is_readmitted(
    tmp_path: Path,
) -> None:
    """XID 79 on the one node of a torchrun job: the engine cordons the node, and with no
    schedulable node left the job is `waiting` (its ranks train on: cordon means no new
    work). An operator readmits the node: a launcher restart, and the job runs again."""
    stack = Stack(tmp_path, Cell("torchrun", wrapper=False, nodes=1))
    try:
        stack.server()
        stack.agents()
        stack.launch()
        ranks = stack.wait_live()
        stack.fault("xid", ranks)

        def waiting() -> dict[str, Any] | None:
            job = stack.get(f"/jobs/{stack.job}")
            return job if job["state"] == "waiting" else None

        job = wait_for(waiting, 60, 0.5)
        (inc,) = stack.incidents()
        assert (inc["cause"], inc["level"], inc["status"]) == ("xid 79", "exclude_node", "open")
        assert inc["outcome"].startswith("waiting"), inc
        node = inc["node"]
        assert stack.get(f"/nodes/{node}")["cordoned"] is True
        t0 = time.time()
        r = stack.http.post(f"/nodes/{node}/uncordon", json={"reason": "GPU reseated"})
        assert r.status_code == 200, r.text
        done = wait_for(lambda: (i := stack.incident(inc["id"]))["status"] != "open" and i, 180)
        assert (done["status"], done["level"]) == ("resolved", "exclude_node"), done
        assert [c["action"] for c in done["commands"]] == ["launcher"], done
        stack.wait_live(after=t0)
        job = stack.get(f"/jobs/{stack.job}")
        assert job["state"] == "running", job
        check(stack.db_url)
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.close()
