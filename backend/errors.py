"""Domain errors raised by services, mapped to HTTP in one handler; the one error body
every handler here (and the app's 422 handler) sends, and its OpenAPI description."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import DBAPIError, OperationalError


class DomainError(Exception):
    status_code = 400

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code  # a stable name for clients that act on this refusal


class NotFound(DomainError):
    status_code = 404


class Conflict(DomainError):
    status_code = 409


class FieldError(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(BaseModel):
    """Every 4xx/5xx of the API: `{"detail": "..."}`; a refused request body or query adds
    the first few field errors (`errors`)."""

    detail: str = Field(description="what is wrong, in words (naming the field for a 422)")
    errors: list[FieldError] | None = Field(
        default=None, description="422 on request validation only: the field errors"
    )
    code: str | None = Field(
        default=None,
        description="a stable name of a refusal a client may act on, e.g. restart_budget "
        "(409: a launcher restart would use the launcher's last one; resend with force)",
    )


# What each status means on this API, for the OpenAPI page (a route may say more).
ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "malformed request (e.g. bad JSON, inconsistent parameters)",
    401: "missing, unknown or revoked bearer token",
    403: "the token lacks the role, or is bound to another node",
    404: "no such resource",
    409: "conflicts with the resource's current state",
    413: "body too large",
    415: "unsupported Content-Type",
    422: "invalid input; the message names the field",
    429: "too many operator actions by this principal; see Retry-After",
    503: "database unavailable; retry (see Retry-After)",
}


# Errors are JSON also on routes that answer text (/metrics) or a stream (/stream); the
# component is added to the document by app.create_app's openapi().
_ERROR_CONTENT = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}


def responses(*codes: int, **descriptions: str) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route: each status with the error body and its description;
    `descriptions` overrides one by name (`_404="unknown job"`)."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        text = descriptions.get(f"_{code}", ERROR_DESCRIPTIONS[code])
        out[code] = {"description": text, "content": _ERROR_CONTENT}
    return out


def unreadable_body(exc: RequestValidationError, content_type: str | None) -> JSONResponse | None:
    """The answer to a JSON body that could not be read, before its fields are judged: 400
    `malformed JSON: ...` (as ingest and acks answer), or 415 when the body was sent as
    another type than JSON (FastAPI hands such a body to the model as bytes). None for an
    ordinary validation error (a 422 naming the field)."""
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            loc = err.get("loc", ())
            where = f" at position {loc[1]}" if len(loc) > 1 else ""
            reason = (err.get("ctx") or {}).get("error", err.get("msg", ""))
            return JSONResponse({"detail": f"malformed JSON: {reason}{where}"}, 400)
    if isinstance(exc.body, bytes | bytearray):
        media = (content_type or "").partition(";")[0].strip().lower()
        return JSONResponse(
            {"detail": f"unsupported content type {media!r}: send application/json"}, 415
        )
    return None


def document_unparsable_bodies(doc: dict[str, Any]) -> None:
    """Every operation that takes a body may answer 400 before its own code runs: FastAPI
    refuses a body that is not text (not UTF-8) with "There was an error parsing the body".
    Adds that 400 to each such operation of an OpenAPI document that does not say it."""
    for item in doc.get("paths", {}).values():
        for op in item.values():
            if isinstance(op, dict) and "requestBody" in op:
                answers = op.setdefault("responses", {})
                answers.setdefault(
                    "400",
                    {"description": "the body cannot be parsed", "content": _ERROR_CONTENT},
                )
                answers.setdefault(
                    "415",
                    {"description": ERROR_DESCRIPTIONS[415], "content": _ERROR_CONTENT},
                )


# The statuses of every route behind a role (ViewerDep, OperatorDep, AgentDep): a token
# lookup reads the database, so 503 applies to each; operator routes add 429.
VIEWER = (401, 403, 503)
OPERATOR = (401, 403, 429, 503)
AGENT = (401, 403, 503)


def install(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def _domain(_: Request, exc: DomainError) -> JSONResponse:
        body: dict[str, Any] = {"detail": exc.message}
        if exc.code is not None:
            body["code"] = exc.code
        return JSONResponse(body, status_code=exc.status_code)

    @app.exception_handler(OperationalError)
    async def _db_down(_: Request, exc: OperationalError) -> JSONResponse:
        # The database is unreachable or busy: retryable, never a 500.
        return JSONResponse(
            {"detail": "database unavailable, retry later"},
            status_code=503,
            headers={"Retry-After": "2"},
        )

    @app.exception_handler(DBAPIError)
    async def _db_error(_: Request, exc: DBAPIError) -> JSONResponse:
        if exc.connection_invalidated:
            return JSONResponse({"detail": "database unavailable, retry later"}, 503)
        raise exc
