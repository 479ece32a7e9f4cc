"""Bearer-token authentication and roles.

Roles: `agent` (ingest and its own commands), `viewer` (reads), `operator` (restarts,
approvals, cordon). The bootstrap token TRAINGUARD_ADMIN_TOKEN is accepted for every role;
per-role hashed tokens come with the security issue. Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, Request, status

Role = Literal["agent", "viewer", "operator"]


@dataclass(frozen=True)
class Principal:
    name: str
    roles: frozenset[str]
    node: str | None = None  # an agent token is bound to one node


def _token_from(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value:
        return value.strip()
    # EventSource cannot send headers: the live stream also takes ?access_token=.
    if request.url.path.endswith("/stream"):
        return request.query_params.get("access_token")
    return None


async def authenticate(request: Request) -> Principal:
    # async on purpose: a sync dependency costs a threadpool hop on every request.
    return _principal(request)


def _principal(request: Request) -> Principal:
    token = _token_from(request)
    if not token:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token (Authorization: Bearer <token>)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    admin: str | None = request.app.state.settings.admin_token
    if admin and hmac.compare_digest(token.encode(), admin.encode()):
        return Principal(name="admin", roles=frozenset({"agent", "viewer", "operator"}))
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED, "invalid token", headers={"WWW-Authenticate": "Bearer"}
    )


def authorize(request: Request, role: Role) -> Principal:
    """The same check as `require(role)`, called directly by the ingest hot path, where
    FastAPI's dependency solving is a measurable part of each request's cost."""
    principal = _principal(request)
    if role not in principal.roles:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"this token lacks the {role} role")
    return principal


def require(role: Role):  # type: ignore[no-untyped-def]
    async def dep(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
        if role not in principal.roles:
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"this token lacks the {role} role")
        return principal

    return dep


AgentDep = Annotated[Principal, Depends(require("agent"))]
ViewerDep = Annotated[Principal, Depends(require("viewer"))]
OperatorDep = Annotated[Principal, Depends(require("operator"))]


def check_node(principal: Principal, node: str) -> None:
    """An agent token bound to a node may act only for that node."""
    if principal.node is not None and principal.node != node:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, f"this token is bound to node {principal.node!r}"
        )
