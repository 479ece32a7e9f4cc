"""The demo never spins silently: runs that end without a step are counted through the
real API, and from the third in a row on the demo says the launcher's last error line and
waits longer before each next run (backend/demo.py, StartWatch)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import TOKEN, free_port
from trainguard.backend import demo
from trainguard.protocol import wire

# What ft_launcher 0.7 printed for every run of the demo before it set NVRx's switch.
CLOSED = (
    "[ERROR] ft_rendezvous_barrier.py:1624 [localhost_1_0] [Step 2] Detected multiple "
    "participants on the same node (localhost) in round 0. This indicates more than one "
    "ft_launcher per node (misconfiguration). Permanently closing the rendezvous."
)


@pytest.fixture
def client(make_client: Any) -> Any:
    """demo-2 trained: one rank reported a step."""
    client = make_client()
    now = time.time()
    batch = wire.Batch(
        node="n1",
        agent_id="agent000001",
        seq=1,
        sent_at=now,
        ranks=[wire.RankStatus(job="demo-2", rank=0, pid=100, world_size=1)],
        steps=[wire.StepReport(job="demo-2", rank=0, step=0, start=now - 1, end=now)],
    )
    assert client.post("/api/v1/ingest", content=wire.encode(batch)).status_code == 200
    return client


def failed_run(tmp_path: Path, name: str) -> Path:
    work = tmp_path / name
    work.mkdir()
    (work / "launcher-0.log").write_text(
        f'starting\n{CLOSED}\nTraceback (most recent call last):\n  File "x"\n'
    )
    (work / "launcher-1.log").write_text("starting\n")
    return work


def test_runs_that_never_train_are_said_with_the_launchers_reason_and_backed_off(
    live_url: str, client: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    watch = demo.StartWatch(live_url, TOKEN)
    waits = [watch.ended(f"demo-{n}", failed_run(tmp_path, f"r{n}")) for n in (1, 3, 4, 5)]
    assert waits == [0.0, 0.0, demo.BACKOFF_FIRST_S, 2 * demo.BACKOFF_FIRST_S]
    said = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(said) == 2, said
    assert "the job does not start (3 runs in a row ended without a step)" in said[0]
    assert "Permanently closing the rendezvous" in said[0]
    # ... and the dashboard shows each: the job failed, "the job does not start", with an
    # incident that took no action
    for job in ("demo-4", "demo-5"):
        j = client.get(f"/api/v1/jobs/{job}").json()
        assert j["state"] == "failed", j
        assert j["state_reason"].startswith("the job does not start: ")
        assert "Permanently closing the rendezvous" in j["state_reason"]
        (inc,) = client.get("/api/v1/incidents", params={"job": job}).json()
        assert (inc["cause"], inc["status"]) == ("launch_failed", "failed")
        assert inc["outcome"] == j["state_reason"]
    assert client.get("/api/v1/incidents", params={"job": "demo-1"}).json() == []
    # a run that trained ends the streak
    assert watch.ended("demo-2", failed_run(tmp_path, "r2")) == 0.0
    assert watch.failed == 0


def test_an_unreachable_server_does_not_hold_the_demo_back(tmp_path: Path) -> None:
    watch = demo.StartWatch(f"http://127.0.0.1:{free_port()}", TOKEN)
    assert [watch.ended("demo-1", failed_run(tmp_path, f"r{n}")) for n in range(4)] == [0.0] * 4


def test_a_launch_failure_is_the_operators_to_report_and_is_one_incident_per_job(
    client: Any, make_client: Any
) -> None:
    r = client.post("/api/v1/jobs/j1/launch-failures", json={"reason": "rendezvous closed"})
    assert r.status_code == 201, r.text
    again = client.post("/api/v1/jobs/j1/launch-failures", json={"reason": "closed again"})
    assert again.json()["id"] == r.json()["id"]  # the same incident, updated
    assert again.json()["outcome"] == "the job does not start: closed again"
    assert client.post("/api/v1/jobs/j1/launch-failures", json={"reason": ""}).status_code == 422
