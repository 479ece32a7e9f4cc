"""GET /api/v1/whoami: the roles of the caller's token, so a client (the dashboard) offers
only the actions the server would allow it; the server still checks every action."""

from __future__ import annotations

from fastapi import APIRouter

from trainguard.backend import errors
from trainguard.backend.auth import SignedInDep
from trainguard.backend.tokens.schemas import Whoami

router = APIRouter(tags=["tokens"])


@router.get(
    "/whoami",
    summary="The caller's token: its principal, roles and node (any valid token)",
    responses=errors.responses(401, 503),
)
def whoami(principal: SignedInDep) -> Whoami:
    return Whoami(
        name=principal.name,
        roles=sorted(principal.roles),  # type: ignore[arg-type]  # roles are Role values
        node=principal.node,
    )
