"""What the engine route answers (DecisionEngine.status)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class EngineStatus(BaseModel):
    """The engine's state on this replica. With the engine off: `enabled`, `leader` and
    `detail` only."""

    enabled: bool
    leader: bool
    detail: str | None = Field(default=None, description="why it is off")
    leadership: str | None = None
    leader_since: float | None = None
    replica: str | None = Field(default=None, description="host:pid of this replica")
    running: bool | None = None
    sweep_s: float | None = None
    last_sweep_at: float | None = None
    cycles: int | None = None
    cursor: int | None = Field(default=None, description="highest event id read")
    decisions: int | None = None
    counts: dict[str, int] | None = None
    errors: int | None = None
    last_error: str | None = None
    policy: dict[str, Any] | None = Field(default=None, description="the policy in force")
