"""Bearer-token authentication and roles.

Roles: `agent` (bound to one node: ingest and its own commands), `viewer` (reads),
`operator` (restarts, approvals, cordon; reads too). Tokens live in `api_tokens` as
SHA-256 hashes (`trainguard token create`); the bootstrap TRAINGUARD_ADMIN_TOKEN is
accepted for every role. Comparisons are constant-time. Lookups are cached for a few
seconds per process, so a revoked token stops working within `TOKEN_CACHE_S`.
"""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool

from backend.tokens import service as tokens

Role = Literal["agent", "viewer", "operator"]
TOKEN_CACHE_S = 5.0
_CACHE_MAX = 10_000


@dataclass(frozen=True)
class Principal:
    name: str
    roles: frozenset[str]
    node: str | None = None  # an agent token is bound to one node


ADMIN = Principal(name="admin", roles=frozenset({"agent", "viewer", "operator"}))


class TokenCache:
    def __init__(self) -> None:
        self._entries: dict[str, tuple[Principal | None, float]] = {}

    def get(self, digest: str) -> tuple[bool, Principal | None]:
        hit = self._entries.get(digest)
        if hit is None or hit[1] < time.monotonic():
            return False, None
        return True, hit[0]

    def put(self, digest: str, principal: Principal | None) -> None:
        if len(self._entries) >= _CACHE_MAX:
            self._entries.clear()
        self._entries[digest] = (principal, time.monotonic() + TOKEN_CACHE_S)


def _token_from(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value:
        return value.strip()
    # EventSource cannot send headers: the live stream also takes ?access_token=.
    if request.url.path.endswith("/stream"):
        return request.query_params.get("access_token")
    return None


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"}
    )


async def _principal(request: Request) -> Principal:
    token = _token_from(request)
    if not token:
        raise _unauthorized("missing bearer token (Authorization: Bearer <token>)")
    if len(token) > 512:
        raise _unauthorized("invalid token")
    app = request.app
    admin: str | None = app.state.settings.admin_token
    if admin and hmac.compare_digest(token.encode(), admin.encode()):
        return ADMIN
    digest = tokens.hash_token(token)
    cache: TokenCache = app.state.token_cache
    found, principal = cache.get(digest)
    if not found:

        def load() -> Principal | None:
            with app.state.sessions() as session:
                row = tokens.lookup(session, token)
                if row is None:
                    return None
                return Principal(
                    name=f"{row.role}:{row.name}",
                    roles=tokens.ROLE_GRANTS[row.role],
                    node=row.node,
                )

        principal = await run_in_threadpool(load)
        cache.put(digest, principal)
    if principal is None:
        raise _unauthorized("invalid or revoked token")
    return principal


async def authorize(request: Request, role: Role) -> Principal:
    """`require(role)` as a plain call, for the ingest hot path, where FastAPI's
    dependency solving is a measurable part of each request's cost."""
    principal = await _principal(request)
    if role not in principal.roles:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"this token lacks the {role} role")
    return principal


def require(role: Role):  # type: ignore[no-untyped-def]
    async def dep(request: Request) -> Principal:
        return await authorize(request, role)

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
