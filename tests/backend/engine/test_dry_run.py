"""The engine as the backend runs it (a background task of the app, woken by ingest):
dry-run recommendations wait for an operator, who approves or rejects them (audited);
the status route says who leads and what the engine did."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from tests.support import wait_for
from trainguard.backend.models import AuditLog
from trainguard.protocol import wire


def post(client: Any, node: str, seq: int, **kw: Any) -> None:
    batch = wire.Batch(node=node, agent_id=f"agent-{node}", seq=seq, sent_at=time.time(), **kw)
    assert client.post("/api/v1/ingest", content=wire.encode(batch)).status_code == 200


def start_job(client: Any, job: str, seq: int = 1) -> None:
    post(
        client,
        "n1",
        seq,
        ranks=[wire.RankStatus(job=job, rank=r, pid=100 + r, world_size=2) for r in (0, 1)],
    )


def exception(client: Any, job: str, seq: int) -> None:
    now = time.time()
    post(client, "n1", seq, events=[wire.Event(kind="exception", ts=now, job=job, rank=0)])


def incident_of(client: Any, job: str) -> dict[str, Any] | None:
    incs = client.get("/api/v1/incidents", params={"job": job}).json()
    return incs[0] if incs else None


def test_dry_run_waits_for_approval_then_issues_commands(make_client: Any, tmp_path: Path) -> None:
    policy = tmp_path / "dry.toml"
    policy.write_text('mode = "dry_run"\n[limits]\ncooldown_s = 0\n')
    client = make_client(policy_file=policy)
    start_job(client, "job-a")
    exception(client, "job-a", 2)
    inc = wait_for(lambda: (i := incident_of(client, "job-a")) and i["status"] == "pending" and i)
    assert inc["level"] == "in_process" and inc["commands"] == []
    assert inc["decisions"][-1]["mode"] == "dry_run"
    assert inc["timeline"]["decided_at"] is not None
    assert client.get("/api/v1/agents/n1/commands", params={"wait": 0}).json() == []
    # More evidence of the same fault joins the recommendation.
    exception(client, "job-a", 3)
    wait_for(lambda: len(incident_of(client, "job-a")["evidence"]) == 2)  # type: ignore[index]  # the job has an incident by now
    assert client.get("/api/v1/agents/n1/commands", params={"wait": 0}).json() == []

    r = client.post(f"/api/v1/incidents/{inc['id']}/approve", json={"reason": "looks right"})
    assert r.status_code == 202, r.text
    cmds = wait_for(lambda: client.get("/api/v1/agents/n1/commands", params={"wait": 0}).json())
    assert [(c["action"], c["incident_id"]) for c in cmds] == [("in_process", inc["id"])]
    inc = incident_of(client, "job-a")
    assert inc is not None and inc["status"] == "open"
    assert [d["mode"] for d in inc["decisions"]] == ["dry_run", "approval", "approved"]
    assert inc["decisions"][-1]["by"] == "admin"
    again = client.post(f"/api/v1/incidents/{inc['id']}/approve", json={"reason": "twice"})
    assert again.status_code == 409 and "not awaiting approval" in again.json()["detail"]

    # A second recommendation, rejected: no command, ever.
    start_job(client, "job-b", 4)
    post(
        client,
        "n1",
        5,
        events=[wire.Event(kind="exception", ts=time.time(), job="job-b", rank=1)],
    )
    pending = wait_for(
        lambda: (i := incident_of(client, "job-b")) and i["status"] == "pending" and i
    )
    r = client.post(f"/api/v1/incidents/{pending['id']}/reject", json={"reason": "a known flake"})
    assert r.status_code == 200 and r.json()["status"] == "rejected"
    assert "a known flake" in r.json()["outcome"]
    engine = client.app.state.decision_engine
    wait_for(lambda: engine.last_sweep_at and engine.last_sweep_at > time.time() - 0.1)
    assert incident_of(client, "job-b")["commands"] == []  # type: ignore[index]  # the job has an incident by now

    with client.app.state.sessions() as s:
        audit = s.scalars(select(AuditLog).order_by(AuditLog.id)).all()
    assert [(a.actor, a.action, a.target, a.reason) for a in audit] == [
        ("admin", "approve:in_process", f"incident:{inc['id']}", "looks right"),
        ("admin", "reject:in_process", f"incident:{pending['id']}", "a known flake"),
    ]


def test_approve_and_reject_refuse_bad_requests(client: Any) -> None:
    assert client.post("/api/v1/incidents/999/approve", json={"reason": "x"}).status_code == 404
    assert client.post("/api/v1/incidents/999/reject", json={"reason": "x"}).status_code == 404
    r = client.post("/api/v1/incidents/1/approve", json={})
    assert r.status_code == 422 and "reason" in r.json()["detail"]
    anon = client.post(
        "/api/v1/incidents/1/approve", json={"reason": "x"}, headers={"Authorization": ""}
    )
    assert anon.status_code == 401
    # A manual restart is no recommendation.
    start_job(client, "job")
    r = client.post("/api/v1/jobs/job/restarts", json={"level": "launcher", "reason": "x"})
    inc = r.json()["incident_id"]
    r = client.post(f"/api/v1/incidents/{inc}/approve", json={"reason": "x"})
    assert r.status_code == 409


def test_the_engine_reacts_within_the_process_and_reports_its_status(client: Any) -> None:
    # (On PostgreSQL the engine takes the advisory lock at its first cycle.)
    status = wait_for(lambda: (st := client.get("/api/v1/engine").json())["leader"] and st)
    assert status["enabled"] is True
    assert status["policy"]["mode"] == "auto" and status["policy"]["source"] == "default"
    start_job(client, "job")
    exception(client, "job", 2)
    cmds = wait_for(lambda: client.get("/api/v1/agents/n1/commands", params={"wait": 0}).json())
    assert [c["action"] for c in cmds] == ["in_process"]
    status = client.get("/api/v1/engine").json()
    assert status["decisions"] == 1 and status["counts"]["commands"] == 1
    assert status["last_sweep_at"] > time.time() - 5
    assert client.get("/api/v1/engine", headers={"Authorization": ""}).status_code == 401


def test_the_engine_can_be_switched_off(make_client: Any) -> None:
    client = make_client(engine_enabled=False)
    assert client.get("/api/v1/engine").json()["enabled"] is False
