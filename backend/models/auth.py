"""API tokens: stored as SHA-256 hashes, shown once at creation, revocable."""

from __future__ import annotations

from sqlalchemy import Float, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from trainguard.backend.models.base import Base


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))  # agent | viewer | operator
    node: Mapped[str | None] = mapped_column(String(128))  # an agent token's node
    # SHA-256 of the token: tokens are 32 random bytes, so a fast hash is enough.
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(12))  # first characters, to recognise it
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(128), default="")
    revoked_at: Mapped[float | None] = mapped_column(Float)
