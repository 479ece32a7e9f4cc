"""Manual restarts become durable commands; agents long-poll them and ack phases, which
fill the incident's timeline."""

from __future__ import annotations

import time
from typing import Any

from trainguard.protocol import wire


def register_job(client: Any, node: str = "n1", ranks: tuple[int, ...] = (0, 1)) -> None:
    now = time.time()
    batch = wire.Batch(
        node=node,
        agent_id="agent000001",
        seq=1,
        sent_at=now,
        ranks=[wire.RankStatus(job="job-1", rank=r, pid=100 + r, world_size=2) for r in ranks],
        steps=[wire.StepReport(job="job-1", rank=0, step=41, start=now - 1, end=now)],
    )
    assert client.post("/api/v1/ingest", content=wire.encode(batch)).status_code == 200


def ack(client: Any, cmd: str, phase: str, node: str = "n1") -> Any:
    return client.post(
        f"/api/v1/commands/{cmd}/acks", json={"phase": phase, "ts": time.time(), "node": node}
    )


def test_manual_restart_reaches_the_agent_and_acks_fill_the_timeline(client: Any) -> None:
    register_job(client)
    r = client.post("/api/v1/jobs/job-1/restarts", json={"level": "in_process", "reason": "x"})
    assert r.status_code == 202, r.text
    incident = r.json()
    assert incident["trigger"] == "manual" and incident["fault_step"] == 41
    cmds = client.get("/api/v1/agents/n1/commands", params={"wait": 0}).json()
    assert [(c["action"], c["params"]["ranks"]) for c in cmds] == [("in_process", "0,1")]
    cid = cmds[0]["id"]
    for phase in ("delivered", "torn_down", "restarted", "resumed"):
        assert ack(client, cid, phase).json() == {"ok": True, "duplicate": False}
    assert ack(client, cid, "resumed").json()["duplicate"] is True
    inc = client.get(f"/api/v1/incidents/{incident['id']}").json()
    t = inc["timeline"]
    assert inc["status"] == "resolved"
    assert t["fault_at"] <= t["delivered_at"] <= t["torn_down_at"] <= t["resumed_at"]
    assert inc["recovery_s"] == t["resumed_at"] - t["fault_at"]
    # Delivered commands are not handed out again.
    assert client.get("/api/v1/agents/n1/commands", params={"wait": 0}).json() == []


def test_an_undelivered_command_survives_a_backend_restart(make_client: Any) -> None:
    first = make_client()
    register_job(first)
    first.post("/api/v1/jobs/job-1/restarts", json={"level": "launcher", "reason": "x"})
    first.__exit__(None, None, None)
    second = make_client()
    cmds = second.get("/api/v1/agents/n1/commands", params={"wait": 0}).json()
    assert [c["action"] for c in cmds] == ["launcher"]


def test_long_poll_returns_when_a_command_is_created(client: Any) -> None:
    register_job(client)
    t0 = time.monotonic()
    assert client.get("/api/v1/agents/n1/commands", params={"wait": 0.3}).json() == []
    assert time.monotonic() - t0 >= 0.3


def test_bad_restart_requests_get_clear_errors(make_client: Any) -> None:
    client = make_client(node_down_after_s=0.2)
    r = client.post("/api/v1/jobs/nope/restarts", json={"level": "launcher", "reason": "x"})
    assert r.status_code == 404 and "nope" in r.json()["detail"]
    register_job(client)
    r = client.post("/api/v1/jobs/job-1/restarts", json={"level": "reboot", "reason": "x"})
    assert r.status_code == 422 and "level" in r.json()["detail"]
    r = client.post("/api/v1/jobs/job-1/restarts", json={"level": "launcher"})
    assert r.status_code == 422 and "reason" in r.json()["detail"]
    time.sleep(0.25)  # the ranks' reports age past the liveness window
    r = client.post("/api/v1/jobs/job-1/restarts", json={"level": "launcher", "reason": "x"})
    assert r.status_code == 409 and "no live ranks" in r.json()["detail"]
    assert ack(client, "no-such-command", "delivered").status_code == 404


def test_an_ack_from_another_node_is_refused(client: Any) -> None:
    register_job(client)
    client.post("/api/v1/jobs/job-1/restarts", json={"level": "launcher", "reason": "x"})
    cid = client.get("/api/v1/agents/n1/commands", params={"wait": 0}).json()[0]["id"]
    assert ack(client, cid, "delivered", node="n2").status_code == 409
    bad = client.post(f"/api/v1/commands/{cid}/acks", json={"phase": "done", "ts": 1, "node": "n1"})
    assert bad.status_code == 422


def test_a_level_the_job_cannot_carry_out_is_refused_in_words(client: Any) -> None:
    now = time.time()
    batch = wire.Batch(
        node="n1",
        agent_id="agent000001",
        seq=1,
        sent_at=now,
        ranks=[
            wire.RankStatus(
                job="job-1", rank=r, pid=100 + r, world_size=2, in_process=False, launcher="none"
            )
            for r in (0, 1)
        ],
    )
    assert client.post("/api/v1/ingest", content=wire.encode(batch)).status_code == 200
    for level, article in (("in_process", "an"), ("launcher", "a")):
        r = client.post("/api/v1/jobs/job-1/restarts", json={"level": level, "reason": "x"})
        assert r.status_code == 409, r.text
        assert r.json()["detail"].startswith(
            f"job 'job-1' cannot carry out {article} {level} restart: "
        )
