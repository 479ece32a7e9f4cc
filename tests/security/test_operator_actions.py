"""Operator actions: rate-limited per principal (token bucket, 429 + Retry-After) and
audited (who, when, what, why); a refused action changes nothing and is not audited."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from tests.security.conftest import Tokens, batch, bearer
from tests.support import TOKEN, wait_for
from trainguard.backend.models import AuditLog
from trainguard.backend.ratelimit import RateLimiter


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def audit_rows(db_url: str) -> list[tuple[str, str, str, str]]:
    engine = create_engine(db_url)
    with Session(engine) as s:
        rows = s.scalars(select(AuditLog).order_by(AuditLog.id)).all()
        out = [(a.actor, a.action, a.target, a.reason) for a in rows]
    engine.dispose()
    return [r for r in out if not r[1].startswith("token:")]


# --- the bucket ---------------------------------------------------------------------------


def test_a_bucket_allows_a_burst_then_the_sustained_rate() -> None:
    clock = FakeClock()
    limiter = RateLimiter(burst=3, per_s=0.5, clock=clock)
    assert [limiter.acquire("bob").allowed for _ in range(4)] == [True, True, True, False]
    refused = limiter.acquire("bob")
    assert not refused.allowed and refused.refused_in_row == 2
    assert refused.retry_after_s == pytest.approx(2.0) and refused.retry_after_header == "2"
    assert limiter.acquire("carol").allowed  # buckets are per principal
    clock.now += 2.0
    assert limiter.acquire("bob").allowed and not limiter.acquire("bob").allowed
    clock.now += 3600  # a long pause refills to the burst, never beyond
    assert sum(limiter.acquire("bob").allowed for _ in range(10)) == 3


def test_a_bucket_set_stays_bounded() -> None:
    clock = FakeClock()
    limiter = RateLimiter(burst=2, per_s=1.0, clock=clock, max_keys=100)
    for i in range(1000):
        limiter.acquire(f"p{i}")
        clock.now += 0.001
    assert len(limiter._buckets) <= 100
    with pytest.raises(ValueError, match="burst >= 1"):
        RateLimiter(burst=0, per_s=1.0)


# --- through the API ----------------------------------------------------------------------


def test_operator_actions_are_limited_per_principal_with_retry_after(
    client: Any, tokens: Tokens, db_url: str
) -> None:
    clock = FakeClock()
    client.app.state.operator_limiter = RateLimiter(burst=3, per_s=0.1, clock=clock)
    assert client.post("/api/v1/ingest", content=batch("n1")).status_code == 200
    op = bearer(tokens.operator)
    for i in range(3):
        r = client.post("/api/v1/nodes/n1/cordon", json={"reason": f"r{i}"}, headers=op)
        assert r.status_code == 200, r.text
    r = client.post("/api/v1/nodes/n1/uncordon", json={"reason": "too fast"}, headers=op)
    assert r.status_code == 429
    assert r.headers["retry-after"] == "10"
    assert r.json()["detail"] == "too many operator actions by operator:bob; retry in 10 s"
    # The refused uncordon did nothing and left no audit row.
    assert client.get("/api/v1/nodes/n1", headers=op).json()["cordoned"] is True
    assert [a[3] for a in audit_rows(db_url)] == ["r0", "r1", "r2"]
    # Other principals, reads and ingest are not affected.
    r = client.post("/api/v1/nodes/n1/uncordon", json={"reason": "admin"}, headers=bearer(TOKEN))
    assert r.status_code == 200
    assert client.get("/api/v1/nodes", headers=op).status_code == 200
    assert client.get("/api/v1/nodes", headers=bearer(tokens.viewer)).status_code == 200
    r = client.post("/api/v1/ingest", content=batch("n1", seq=2), headers=bearer(tokens.agent_n1))
    assert r.status_code == 200
    # A caller without the operator role is refused before the bucket (403, no token).
    r = client.post("/api/v1/nodes/n1/cordon", json={"reason": "x"}, headers=bearer(tokens.viewer))
    assert r.status_code == 403
    clock.now += 10
    r = client.post("/api/v1/nodes/n1/cordon", json={"reason": "later"}, headers=op)
    assert r.status_code == 200


def test_the_default_limit_leaves_room_for_a_rack_of_cordons(client: Any, tokens: Tokens) -> None:
    """30 actions at once (a rack of nodes), then one every 2 s. The bucket's clock is
    held still: on a loaded machine 31 requests can take over 2 s, which would refill a
    token and let the 31st through."""
    settings = client.app.state.settings
    client.app.state.operator_limiter = RateLimiter(
        burst=settings.operator_rate_burst,
        per_s=settings.operator_rate_per_min / 60.0,
        clock=FakeClock(),
    )
    op = bearer(tokens.operator)
    for i in range(4):
        assert client.post("/api/v1/ingest", content=batch(f"r{i}")).status_code == 200
    codes = [
        client.post(f"/api/v1/nodes/r{i % 4}/cordon", json={"reason": "rack"}, headers=op)
        for i in range(31)
    ]
    assert [c.status_code for c in codes] == [200] * 30 + [429]
    assert codes[-1].headers["retry-after"] == "2"


def test_every_operator_action_is_audited_with_who_and_why(
    make_client: Any, tokens: Tokens, db_url: str, tmp_path: Path
) -> None:
    policy = tmp_path / "dry.toml"
    policy.write_text('mode = "dry_run"\n[limits]\ncooldown_s = 0\n')
    client = make_client(policy_file=policy)
    op = bearer(tokens.operator)
    seq = iter(range(1, 100))

    def ingest(**kw: Any) -> None:
        r = client.post("/api/v1/ingest", content=batch("n1", seq=next(seq), **kw))
        assert r.status_code == 200, r.text

    def recommendation(job: str) -> int:
        """A dry-run recommendation of the engine for `job`, pending approval."""
        ingest(ranks=[{"job": job, "rank": 0, "pid": 4242}])
        ingest(events=[{"kind": "exception", "ts": time.time(), "job": job, "rank": 0}])

        def pending() -> Any:
            return client.get("/api/v1/incidents", params={"job": job, "status": "pending"}).json()

        return int(wait_for(pending)[0]["id"])

    ingest()
    assert client.post("/api/v1/nodes/n1/cordon", json={"reason": "HBM"}, headers=op).is_success
    assert client.post("/api/v1/nodes/n1/uncordon", json={"reason": "ok"}, headers=op).is_success
    approved, rejected = recommendation("job-a"), recommendation("job-b")
    r = client.post(f"/api/v1/incidents/{approved}/approve", json={"reason": "go"}, headers=op)
    assert r.status_code == 202, r.text
    r = client.post(f"/api/v1/incidents/{rejected}/reject", json={"reason": "flake"}, headers=op)
    assert r.status_code == 200, r.text
    ingest(ranks=[{"job": "job-c", "rank": 0, "pid": 4243}])
    r = client.post(
        "/api/v1/jobs/job-c/restarts", json={"level": "launcher", "reason": "hung"}, headers=op
    )
    assert r.status_code == 202, r.text
    # Refused actions leave no trace in the audit log.
    unknown = {"level": "launcher", "reason": "x"}
    assert client.post("/api/v1/jobs/nope/restarts", json=unknown, headers=op).status_code == 404
    viewer = bearer(tokens.viewer)
    assert client.post("/api/v1/nodes/n1/cordon", json={}, headers=viewer).status_code == 403

    assert audit_rows(db_url) == [
        ("operator:bob", "cordon", "node:n1", "HBM"),
        ("operator:bob", "uncordon", "node:n1", "ok"),
        ("operator:bob", "approve:in_process", f"incident:{approved}", "go"),
        ("operator:bob", "reject:in_process", f"incident:{rejected}", "flake"),
        ("operator:bob", "restart:launcher", "job:job-c", "hung"),
    ]
    engine = create_engine(db_url)
    with Session(engine) as s:
        stamps = [a.ts for a in s.scalars(select(AuditLog).order_by(AuditLog.id))]
    engine.dispose()
    assert all(time.time() - 60 < t <= time.time() for t in stamps)
