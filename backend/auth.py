"""Bearer-token authentication and roles.

Roles: `agent` (bound to one node: ingest and its own commands), `viewer` (reads),
`operator` (restarts, approvals, cordon; reads too). Tokens live in `api_tokens` as
SHA-256 hashes (`trainguard token create`); the bootstrap TRAINGUARD_ADMIN_TOKEN is
accepted for every role. Comparisons are constant-time. Lookups are cached for a few
seconds per process, so a revoked token stops working within `TOKEN_CACHE_S`.

Operator actions (every route behind `OperatorDep`) are rate-limited per principal with a
token bucket (backend/ratelimit.py): 429 with `Retry-After` when the bucket is empty.
Refused requests (401, 403, 429) are logged, throttled, with the principal or client
address and never the token (docs/security.md).
"""

from __future__ import annotations

import hmac
import logging
import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool

from trainguard.backend import errors
from trainguard.backend.ratelimit import RateLimiter
from trainguard.backend.tokens import service as tokens
from trainguard.backend.tokens.schemas import Whoami

log = logging.getLogger(__name__)

Role = Literal["agent", "viewer", "operator"]
TOKEN_CACHE_S = 5.0
_CACHE_MAX = 10_000
# Operator actions per principal: a burst, then a sustained rate. Settings
# `operator_rate_burst` / `operator_rate_per_min` override these when present.
OPERATOR_BURST = 30
OPERATOR_PER_MIN = 30.0
_LOG_EVERY_S = 60.0  # one log line per (who, what) refusal kind and minute


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


class _LogThrottle:
    """At most one log line per key and `_LOG_EVERY_S`: a misconfigured agent fleet
    retrying with a bad token must not flood the log."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def ok(self, key: str) -> bool:
        now = time.monotonic()
        if now - self._last.get(key, float("-inf")) < _LOG_EVERY_S:
            return False
        if len(self._last) >= _CACHE_MAX:
            self._last.clear()
        self._last[key] = now
        return True


_throttle = _LogThrottle()


def _client(request: Request) -> str:
    return request.client.host if request.client else "-"


def _refused(request: Request, code: int, who: str, detail: str) -> None:
    if _throttle.ok(f"{code}:{who}:{_client(request)}:{request.url.path}"):
        log.warning(
            "refused %d %s %s from %s (%s): %s",
            code,
            request.method,
            request.url.path,
            _client(request),
            who,
            detail,
        )


def _unauthorized(request: Request, detail: str) -> HTTPException:
    _refused(request, 401, "no principal", detail)
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"}
    )


async def _principal(request: Request) -> Principal:
    token = _token_from(request)
    if not token:
        raise _unauthorized(request, "missing bearer token (Authorization: Bearer <token>)")
    if len(token) > 512:
        raise _unauthorized(request, "invalid token")
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
        raise _unauthorized(request, "invalid or revoked token")
    return principal


async def authorize(request: Request, role: Role) -> Principal:
    """`require(role)` as a plain call, for the ingest hot path, where FastAPI's
    dependency solving is a measurable part of each request's cost."""
    principal = await _principal(request)
    if role not in principal.roles:
        detail = f"this token lacks the {role} role"
        _refused(request, 403, principal.name, detail)
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail)
    return principal


def operator_limiter(app: Any) -> RateLimiter:
    """The process's bucket set for operator actions (created on first use)."""
    limiter: RateLimiter | None = getattr(app.state, "operator_limiter", None)
    if limiter is None:
        settings = app.state.settings
        burst = getattr(settings, "operator_rate_burst", OPERATOR_BURST)
        per_min = getattr(settings, "operator_rate_per_min", OPERATOR_PER_MIN)
        limiter = app.state.operator_limiter = RateLimiter(burst, per_min / 60.0)
    return limiter


def limit_operator_action(request: Request, principal: Principal) -> None:
    """Take one token from the principal's bucket, or refuse with 429 + Retry-After."""
    decision = operator_limiter(request.app).acquire(principal.name)
    if decision.allowed:
        return
    detail = (
        f"too many operator actions by {principal.name}; retry in {decision.retry_after_header} s"
    )
    if decision.refused_in_row == 1 or _throttle.ok(f"429:{principal.name}"):
        log.warning(
            "rate limit: %s %s by %s from %s refused (%d in a row)",
            request.method,
            request.url.path,
            principal.name,
            _client(request),
            decision.refused_in_row,
        )
    raise HTTPException(
        status.HTTP_429_TOO_MANY_REQUESTS,
        detail,
        headers={"Retry-After": decision.retry_after_header},
    )


def require(role: Role):
    async def dep(request: Request) -> Principal:
        principal = await authorize(request, role)
        if role == "operator":  # every operator route is an action (restart, cordon ...)
            limit_operator_action(request, principal)
        return principal

    return dep


# Any valid token, whatever its roles (GET /whoami).
SignedInDep = Annotated[Principal, Depends(_principal)]


# GET /api/v1/whoami: the roles of the caller's token, so a client (the dashboard) offers
# only the actions the server would allow it; the server still checks every action.
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


AgentDep = Annotated[Principal, Depends(require("agent"))]
ViewerDep = Annotated[Principal, Depends(require("viewer"))]
OperatorDep = Annotated[Principal, Depends(require("operator"))]


def check_node(principal: Principal, node: str) -> None:
    """An agent token bound to a node may act only for that node."""
    if principal.node is not None and principal.node != node:
        detail = f"this token is bound to node {principal.node!r}"
        if _throttle.ok(f"403:{principal.name}:node:{node}"):
            log.warning("refused 403: %s acted for node %r: %s", principal.name, node, detail)
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail)
