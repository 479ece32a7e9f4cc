"""The answer of GET /api/v1/whoami."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Whoami(BaseModel):
    name: str = Field(description="the principal: `<role>:<token name>`, or `admin`")
    roles: list[Literal["agent", "viewer", "operator"]] = Field(
        description="what the token may do (an operator token also views)"
    )
    node: str | None = Field(description="the node an agent token is bound to")
