"""The timeout hierarchy (docs/restarts.md, "Timeout hierarchy"): one test per rule, with
the launcher's values read from real launch lines by the SDK's own parser, posted through
the real ingest and read back from GET /jobs/{job} and the events (both databases)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from trainguard.backend.jobs.timeouts import RULES
from trainguard.protocol import wire
from trainguard.sdk.timeouts import launcher_timeouts

PY = "/usr/bin/python3"
# Launch lines as /proc/<launcher pid>/cmdline holds them.
TORCHRUN = [
    PY,
    "/opt/venv/bin/torchrun",
    "--nnodes",
    "2",
    "--nproc-per-node",
    "8",
    "--rdzv-backend",
    "c10d",
    "--rdzv-endpoint",
    "n1:29400",
    "--max-restarts",
    "3",
]
FT_041 = [
    PY,
    "/opt/venv/bin/ft_launcher",
    "--nproc-per-node",
    "8",
    "--max-restarts",
    "3",
    "--ft-param-initial_rank_heartbeat_timeout",
    "600",
    "--ft-param-rank_heartbeat_timeout",
    "300",
    "--ft-param-workload_check_interval",
    "5",
]
FT_070 = [PY, "/opt/venv/bin/ft_launcher", "--nproc-per-node=8", "--max-restarts=3",
          "--ft-initial-rank-heartbeat-timeout=600", "--ft-rank-heartbeat-timeout=300",
          "--ft-workload-check-interval=5"]  # fmt: skip


def launched(line: list[str], *flags: str, script: str = "train.py") -> dict[str, float]:
    return launcher_timeouts([*line, *flags, script, "--lr", "3e-4"], {})


def post(client: Any, timeouts: list[dict[str, Any]], seq: int = 1, job: str = "job") -> None:
    batch = wire.Batch(
        node="n1",
        agent_id="agent-n1",
        seq=seq,
        sent_at=time.time(),
        ranks=[
            wire.RankStatus(job=job, rank=r, pid=1000 + r, world_size=len(timeouts),
                            timeouts=wire.Timeouts(**t))
            for r, t in enumerate(timeouts)
        ],
    )  # fmt: skip
    r = client.post("/api/v1/ingest", content=wire.encode(batch))
    assert r.status_code == 200, r.text


def codes(client: Any, job: str = "job") -> list[str]:
    j = client.get(f"/api/v1/jobs/{job}").json()
    return [w["code"] for w in j["timeout_warnings"]]


def events(client: Any, job: str = "job") -> list[dict[str, Any]]:
    client.app.state.analytics.tick()
    return client.get("/api/v1/events", params={"kind": "timeouts", "job": job}).json()


# (rule, a launch's timeouts that keep the rule, the same launch breaking it)
AGENT = {"first_step_s": 120.0, "restart_wait_s": 180.0}
CASES = [
    ("collective_over_checkpoint",
     {"collective_s": 1800.0, "checkpoint_save_s": 240.0},
     {"collective_s": 600.0, "checkpoint_save_s": 900.0}),
    ("wrapper_soft_over_checkpoint",
     {"wrapper_soft_s": 60.0, "wrapper_hard_s": 90.0, "checkpoint_save_s": 20.0},
     {"wrapper_soft_s": 60.0, "wrapper_hard_s": 90.0, "checkpoint_save_s": 75.0}),
    ("launcher_heartbeat_over_checkpoint",
     {**launched(FT_070), "checkpoint_save_s": 100.0},
     {**launched(FT_070), "checkpoint_save_s": 400.0}),
    ("hang_under_launcher_heartbeat",
     {**launched(FT_041), "hang_s": 30.0},
     {**launched(FT_041), "hang_s": 3000.0}),
    ("first_step_under_launcher_initial",
     {**launched(FT_070), **AGENT},
     {**launched(FT_070, "--ft-initial-rank-heartbeat-timeout", "60"), **AGENT}),
    ("wrapper_soft_under_hard",
     {"wrapper_soft_s": 60.0, "wrapper_hard_s": 90.0},
     {"wrapper_soft_s": 90.0, "wrapper_hard_s": 60.0}),
    ("wrapper_restart_under_launcher_heartbeat",
     {**launched(FT_041), "wrapper_hard_s": 90.0, "wrapper_barrier_s": 120.0},
     {**launched(FT_041), "wrapper_hard_s": 90.0, "wrapper_barrier_s": 240.0}),
    ("launcher_check_under_heartbeat",
     launched(FT_041),
     launched(FT_041, "--ft-param-workload_check_interval", "300")),
    ("monitor_interval_under_restart_wait",
     {**launched(TORCHRUN, "--monitor-interval", "5"), **AGENT},
     {**launched(TORCHRUN, "--monitor-interval", "600"), **AGENT}),
]  # fmt: skip


def test_every_rule_has_a_case() -> None:
    assert [c[0] for c in CASES] == [r.code for r in RULES]


def test_a_collective_timeout_shorter_than_the_hang_threshold_is_no_warning(client: Any) -> None:
    # A short gloo timeout is what lets a rank blocked in a collective take the restart
    # signal (docs/restarts.md): not a rule, whatever trainguard's hang threshold is.
    post(client, [{"collective_s": 5.0, "hang_s": 30.0, **AGENT}])
    assert codes(client) == []


@pytest.mark.parametrize(("code", "good", "bad"), CASES, ids=[c[0] for c in CASES])
def test_each_rule_warns_only_when_broken(
    client: Any, code: str, good: dict[str, Any], bad: dict[str, Any]
) -> None:
    post(client, [good, good])
    assert codes(client) == []
    assert events(client) == []
    post(client, [good, bad], seq=2)  # one rank is enough
    assert codes(client) == [code]
    w = client.get("/api/v1/jobs/job").json()["timeout_warnings"][0]
    assert w["shorter"] >= w["longer"]
    assert w["fix"].endswith(".") and w["fix"].count(". ") == 0, w["fix"]  # one sentence
    (ev,) = events(client)
    assert ev["data"]["code"] == code
    assert w["fix"] in ev["message"]
    assert events(client) == [ev]  # announced once


def test_the_launch_lines_read_as_ft_launcher_and_torchrun_say() -> None:
    # 0.4.1's --ft-param-* spellings and 0.7.0's --ft-*=value read the same
    assert (
        launched(FT_041)
        == launched(FT_070)
        == {
            "launcher_heartbeat_s": 300.0,
            "launcher_initial_heartbeat_s": 600.0,
            "launcher_check_interval_s": 5.0,
            "monitor_interval_s": 0.1,
        }
    )
    # torchrun has no heartbeat timeouts; the script's own flags are not the launcher's
    assert launched(TORCHRUN, script="train.py") == {"monitor_interval_s": 0.1}
    assert launcher_timeouts([*TORCHRUN, "t.py", "--monitor-interval", "9"], {}) == {
        "monitor_interval_s": 0.1
    }
    assert launcher_timeouts([*TORCHRUN, "t.py"], {"PET_MONITOR_INTERVAL": "2"}) == {
        "monitor_interval_s": 2.0
    }
    # NVRx's defaults when the line says nothing; "none" is no timeout
    bare = launcher_timeouts([PY, "/v/bin/ft_launcher", "--ft-rank-heartbeat-timeout", "none",
                              "t.py"], {})  # fmt: skip
    assert bare == {
        "launcher_initial_heartbeat_s": 3600.0,
        "launcher_check_interval_s": 5.0,
        "monitor_interval_s": 0.1,
    }


def test_a_checkpoint_that_grows_past_the_collective_timeout_warns_later(client: Any) -> None:
    rank = {**launched(FT_070), "collective_s": 600.0, "hang_s": 20.0, **AGENT}
    post(client, [{**rank, "checkpoint_save_s": 120.0}])
    assert codes(client) == []
    assert events(client) == []
    post(client, [{**rank, "checkpoint_save_s": 650.0}], seq=2)
    assert codes(client) == [
        "collective_over_checkpoint",
        "launcher_heartbeat_over_checkpoint",
    ]
    assert {e["data"]["code"] for e in events(client)} == set(codes(client))
    j = client.get("/api/v1/jobs/job").json()
    assert j["state"] == "running"  # a warning never blocks the job
    assert j["ranks"][0]["timeouts"]["checkpoint_save_s"] == 650.0


def test_a_job_without_reported_timeouts_has_no_warnings(client: Any) -> None:
    batch = wire.Batch(node="n1", agent_id="agent-n1", seq=1, sent_at=time.time(),
                       ranks=[wire.RankStatus(job="old", rank=0, pid=1)])  # fmt: skip
    assert client.post("/api/v1/ingest", content=wire.encode(batch)).status_code == 200
    j = client.get("/api/v1/jobs/old").json()
    assert j["timeout_warnings"] == [] and j["ranks"][0]["timeouts"] is None


@pytest.mark.parametrize("value", [-1, 1e300, "600", True])
def test_an_absurd_timeout_is_refused_with_a_4xx_naming_it(client: Any, value: Any) -> None:
    body = {
        "node": "n1",
        "agent_id": "agent-n1",
        "seq": 1,
        "sent_at": time.time(),
        "ranks": [{"job": "job", "rank": 0, "pid": 1, "timeouts": {"collective_s": value}}],
    }
    r = client.post("/api/v1/ingest", json=body)
    assert r.status_code == 422, r.text
    assert "collective_s" in r.text
    assert client.get("/api/v1/jobs/job").status_code == 404  # nothing of it stored
