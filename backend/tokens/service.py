"""Create, list, revoke and look up API tokens."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainguard.backend import audit
from trainguard.backend.errors import DomainError, NotFound
from trainguard.backend.models import ApiToken

ROLES = ("agent", "viewer", "operator")
# What each role may do: an operator also reads; an agent only ingests and takes its
# own node's commands.
ROLE_GRANTS = {
    "agent": frozenset({"agent"}),
    "viewer": frozenset({"viewer"}),
    "operator": frozenset({"viewer", "operator"}),
}
PREFIX = "tg_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Created:
    id: int
    token: str  # shown once, never stored
    role: str
    node: str | None


def create(session: Session, role: str, name: str, node: str | None, actor: str = "cli") -> Created:
    if role not in ROLES:
        raise DomainError(f"unknown role {role!r}; choose one of {', '.join(ROLES)}")
    if role == "agent" and not node:
        raise DomainError("an agent token must be bound to a node (--node NAME)")
    if role != "agent" and node:
        raise DomainError("only agent tokens are bound to a node")
    token = PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(
        name=name or f"{role}{'-' + node if node else ''}",
        role=role,
        node=node,
        token_hash=hash_token(token),
        prefix=token[:10],
        created_at=time.time(),
        created_by=actor,
    )
    session.add(row)
    audit.record(
        session,
        ts=row.created_at,
        actor=actor,
        action="token:create",
        target=f"token:{row.name}",
        reason=role,
    )
    session.flush()
    return Created(id=row.id, token=token, role=role, node=node)


def revoke(session: Session, token_id: int, actor: str = "cli") -> ApiToken:
    row = session.get(ApiToken, token_id)
    if row is None:
        raise NotFound(f"no token with id {token_id}")
    if row.revoked_at is None:
        row.revoked_at = time.time()
        audit.record(
            session,
            ts=row.revoked_at,
            actor=actor,
            action="token:revoke",
            target=f"token:{row.name}",
            reason="",
        )
    return row


def list_tokens(session: Session) -> list[dict[str, Any]]:
    rows = session.scalars(select(ApiToken).order_by(ApiToken.id)).all()
    return [
        {
            "id": r.id,
            "name": r.name,
            "role": r.role,
            "node": r.node,
            "prefix": r.prefix,
            "created_at": r.created_at,
            "revoked": r.revoked_at is not None,
        }
        for r in rows
    ]


def lookup(session: Session, token: str) -> ApiToken | None:
    """The live (not revoked) token row for a presented token, or None."""
    digest = hash_token(token)
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == digest))
    if row is None or row.revoked_at is not None:
        return None
    # The index lookup found it by hash; compare once more in constant time.
    return row if hmac.compare_digest(row.token_hash, digest) else None


def any_live(session: Session) -> bool:
    """Whether the token store holds at least one usable token."""
    return (
        session.scalar(select(ApiToken.id).where(ApiToken.revoked_at.is_(None)).limit(1))
        is not None
    )
