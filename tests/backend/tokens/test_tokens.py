"""Roles and tokens: hashed at rest, shown once, revocable, agent tokens bound to a node."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from trainguard.backend import auth
from trainguard.backend.errors import DomainError
from trainguard.backend.models import ApiToken
from trainguard.backend.tokens import service
from trainguard.protocol import wire


def make_token(db_url: str, role: str, node: str | None = None) -> tuple[int, str]:
    engine = create_engine(db_url)
    with Session(engine) as session:
        created = service.create(session, role, "", node)
        session.commit()
    engine.dispose()
    return created.id, created.token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def batch(node: str) -> bytes:
    return wire.encode(wire.Batch(node=node, agent_id="agent000001", seq=1, sent_at=time.time()))


def test_tokens_are_stored_only_as_hashes(db_url: str) -> None:
    _, token = make_token(db_url, "viewer")
    engine = create_engine(db_url)
    with Session(engine) as session:
        row = session.scalars(select(ApiToken)).one()
    engine.dispose()
    assert token not in (row.token_hash, row.name) and row.token_hash == service.hash_token(token)
    assert token.startswith(row.prefix)


def test_each_role_may_do_only_its_own_things(client: Any, db_url: str) -> None:
    _, viewer = make_token(db_url, "viewer")
    _, operator = make_token(db_url, "operator")
    _, agent = make_token(db_url, "agent", node="n1")
    # agent: ingest for its own node only; no reads.
    assert (
        client.post("/api/v1/ingest", content=batch("n1"), headers=bearer(agent)).status_code == 200
    )
    r = client.post("/api/v1/ingest", content=batch("n2"), headers=bearer(agent))
    assert r.status_code == 403 and "bound to node 'n1'" in r.json()["detail"]
    assert client.get("/api/v1/agents/n2/commands?wait=0", headers=bearer(agent)).status_code == 403
    assert client.get("/api/v1/agents/n1/commands?wait=0", headers=bearer(agent)).status_code == 200
    assert client.get("/api/v1/nodes", headers=bearer(agent)).status_code == 403
    # viewer: reads, no ingest, no control.
    assert client.get("/api/v1/nodes", headers=bearer(viewer)).status_code == 200
    assert (
        client.post("/api/v1/ingest", content=batch("n1"), headers=bearer(viewer)).status_code
        == 403
    )
    r = client.post("/api/v1/nodes/n1/cordon", json={"reason": "x"}, headers=bearer(viewer))
    assert r.status_code == 403
    # operator: control and reads.
    r = client.post("/api/v1/nodes/n1/cordon", json={"reason": "x"}, headers=bearer(operator))
    assert r.status_code == 200
    assert client.get("/api/v1/nodes", headers=bearer(operator)).status_code == 200


def test_a_revoked_token_stops_working(
    client: Any, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auth, "TOKEN_CACHE_S", 0.0)
    token_id, viewer = make_token(db_url, "viewer")
    assert client.get("/api/v1/nodes", headers=bearer(viewer)).status_code == 200
    engine = create_engine(db_url)
    with Session(engine) as session:
        service.revoke(session, token_id)
        session.commit()
    engine.dispose()
    r = client.get("/api/v1/nodes", headers=bearer(viewer))
    assert r.status_code == 401 and "revoked" in r.json()["detail"]


def test_bad_token_requests_are_refused_clearly(db_url: str) -> None:
    engine = create_engine(db_url)
    with Session(engine) as session:
        with pytest.raises(DomainError, match="bound to a node"):
            service.create(session, "agent", "", None)
        with pytest.raises(DomainError, match="unknown role"):
            service.create(session, "root", "", None)
        with pytest.raises(DomainError, match="only agent tokens"):
            service.create(session, "viewer", "", "n1")
    engine.dispose()
