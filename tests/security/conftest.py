"""Tokens of every role, created through the real token service in the test's database."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from trainguard.backend.tokens import service
from trainguard.protocol import wire


@dataclass(frozen=True)
class Tokens:
    agent_n1: str
    agent_n2: str
    viewer: str
    operator: str


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def batch(node: str, seq: int = 1, agent_id: str = "agent000001", **kw: object) -> bytes:
    return wire.encode(
        wire.Batch(node=node, agent_id=agent_id, seq=seq, sent_at=time.time(), **kw)  # type: ignore[arg-type]  # callers pass Batch's field types
    )


@pytest.fixture
def tokens(db_url: str) -> Tokens:
    engine = create_engine(db_url)
    with Session(engine) as session:
        made = [
            service.create(session, "agent", "n1", "n1").token,
            service.create(session, "agent", "n2", "n2").token,
            service.create(session, "viewer", "alice", None).token,
            service.create(session, "operator", "bob", None).token,
        ]
        session.commit()
    engine.dispose()
    return Tokens(*made)
