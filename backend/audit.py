"""The audit log: who did what to which job, node or token, and why. The one place its
rows are written (tests/backend/test_table_owners.py checks that)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from trainguard.backend.models import AuditLog


def record(
    session: Session, ts: float, actor: str, action: str, target: str, reason: str = ""
) -> None:
    """One audited act, in the caller's transaction (so it is kept exactly when the act is)."""
    session.add(AuditLog(ts=ts, actor=actor, action=action, target=target, reason=reason[:2000]))
