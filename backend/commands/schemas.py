"""What the agents' command channel answers (the incident reads: incidents.schemas)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class AckResult(BaseModel):
    ok: bool
    duplicate: bool = Field(description="this phase of the command was already acknowledged")
