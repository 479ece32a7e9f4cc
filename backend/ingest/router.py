"""POST /api/v1/ingest: decode with msgspec, hand to the group-commit writer, answer
when stored.

Every node posts here every second, so the route's framework cost is most of its cost:
FastAPI's routing, dependency solving and exception middleware took about half of the
backend's CPU per batch (py-spy, docs/benchmarks.md). `answer` is a plain ASGI app that
the backend's app (app.Api) calls for `POST /api/v1/ingest` before any of that runs, with
the same handler (`handle`) and the same error bodies; the FastAPI route below stays for
the OpenAPI document and calls the same handler."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec
from fastapi import APIRouter, HTTPException, Request, Response
from sqlalchemy.exc import OperationalError
from starlette.types import Receive, Scope, Send

from trainguard.backend import errors
from trainguard.backend.auth import authorize, check_node
from trainguard.backend.ingest.writer import BatchRefused, DatabaseUnavailable
from trainguard.protocol import wire

router = APIRouter(tags=["agents"])
INGEST_PATH = "/api/v1/ingest"

_MAX_FUTURE_S = 24 * 3600.0  # timestamps more than this ahead of the server are refused
# ... and more than this behind it. Agents replay what they spooled while the backend was
# away: the default 256 MiB spool holds about a day of an 8-GPU node at 1 s and a week of
# a 1-GPU node. Anything older comes from a clock that was reset (1970, a dead RTC).
_MAX_PAST_S = 7 * 24 * 3600.0
_INT32 = 2**31 - 1
_INT64 = 2**63 - 1

# Sample readings stored in 32-bit columns are bounded by their wire type (wire.Count32):
# the decoder refuses a larger value with its path, and no pass over the samples is made
# here (tests/security/test_input_limits.py checks every such column).


def _batch_schema() -> dict[str, Any]:
    """The wire schema with the bounds `_check_batch` adds (relative to the server's clock,
    so they are words, not `minimum`/`maximum`)."""
    schema = wire.json_schema(wire.Batch)
    props = schema.get("properties", {})
    window = (
        f"within {_MAX_PAST_S / 86400:g} days before and {_MAX_FUTURE_S / 3600:g} h after "
        "the server's clock"
    )
    if "sent_at" in props:
        props["sent_at"]["description"] = f"Unix seconds, {window}"
    if "seq" in props:
        props["seq"]["maximum"] = _INT64
    schema["description"] = (
        f"Every timestamp (sent_at, samples[].ts, events[].ts, steps[].start/end, "
        f"ranks[].last_heartbeat) must lie {window}; integers stored in 32-bit columns "
        f"(steps[].step/attempt/iteration, ranks[].pid/attempt/iteration/last_step) "
        f"at most {_INT32}; "
        "the body at most TRAINGUARD_MAX_BODY_BYTES."
    )
    return schema


@router.post(
    "/ingest",
    summary="Store one agent batch (samples, events, steps, rank status)",
    openapi_extra={
        "requestBody": {
            "required": True,
            # The same messages in either encoding (agent/protocol/wire.py).
            "content": {
                wire.JSON_TYPE: {"schema": _batch_schema()},
                wire.MSGPACK_TYPE: {"schema": _batch_schema()},
            },
        }
    },
    responses={
        200: {
            "description": "stored (or a duplicate of a stored batch)",
            "content": {"application/json": {"schema": wire.json_schema(wire.IngestResult)}},
        },
        **errors.responses(
            400,
            401,
            403,
            413,
            415,
            422,
            503,
            _400="malformed JSON; nothing was stored",
            _403="not an agent token, or bound to another node",
            _415="a Content-Type other than JSON or MessagePack; nothing was stored",
            _422="invalid batch; nothing was stored; the message names the field",
        ),
    },
)
async def ingest(request: Request) -> Response:
    return await handle(request)


# Sent with every ingest answer: what a body may be (an agent switches to MessagePack
# when it sees it there).
ACCEPT_POST = f"{wire.JSON_TYPE}, {wire.MSGPACK_TYPE}"
_HEADERS = {"Accept-Post": ACCEPT_POST}


def _decoder(content_type: str | None) -> Callable[[bytes], wire.Batch]:
    """The body's decoder by its Content-Type (parameters such as charset ignored; none
    given is JSON, as curl sends it); 415 for any other type."""
    media = (content_type or "").partition(";")[0].strip().lower()
    if media in ("", wire.JSON_TYPE):
        return wire.decode_batch
    if media in wire.MSGPACK_TYPES:
        return wire.decode_batch_msgpack
    raise HTTPException(
        415,
        f"unsupported content type {media!r}: send {wire.JSON_TYPE} or {wire.MSGPACK_TYPE}",
        headers=_HEADERS,
    )


def _unavailable() -> HTTPException:
    return HTTPException(503, "database unavailable, retry later", headers={"Retry-After": "2"})


async def handle(request: Request) -> Response:
    """Authorize, read, decode, check, store; raises HTTPException with the message (503
    when the database is unavailable, for the token lookup or the write)."""
    try:
        principal = await authorize(request, "agent")
    except OperationalError:
        raise _unavailable() from None
    limit: int = request.app.state.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"body of {declared} bytes exceeds the limit of {limit}")
    decode = _decoder(request.headers.get("content-type"))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:  # a lying or absent Content-Length
            raise HTTPException(413, f"body exceeds the limit of {limit} bytes")
    body = b"".join(chunks)  # one chunk (the usual case) is not copied
    del chunks
    try:
        batch = decode(body)
    except msgspec.ValidationError as exc:
        raise HTTPException(422, f"invalid batch: {exc}") from None
    except msgspec.DecodeError as exc:
        what = "JSON" if decode is wire.decode_batch else "MessagePack"
        raise HTTPException(400, f"malformed {what}: {exc}") from None
    # The body is not needed past here: a request waiting for its group commit holds
    # only the decoded batch (with 16,384 agents in flight, 17 KB each was 280 MB).
    del body
    check_node(principal, batch.node)
    received_at = time.time()
    _check_batch(batch, received_at)
    try:
        result = await request.app.state.writer.submit_async(batch, received_at)
    except BatchRefused as exc:
        raise HTTPException(422, f"invalid batch: the database refused it: {exc}") from None
    except DatabaseUnavailable:
        raise _unavailable() from None
    result.batch_interval_s = request.app.state.settings.agent_batch_interval_s
    result.launchers = True  # this backend stores Batch.launchers (the job's shape)
    return Response(wire.encode(result), media_type=wire.JSON_TYPE, headers=_HEADERS)


def is_ingest(scope: Scope) -> bool:
    """An agent's batch: `POST /api/v1/ingest`, which `answer` serves."""
    return scope["type"] == "http" and scope["path"] == INGEST_PATH and scope["method"] == "POST"


async def answer(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers one `POST /api/v1/ingest` as a plain ASGI app, ahead of the framework (the
    module doc; app.Api calls it, with `scope["app"]` set). Errors have the app's shape:
    `{"detail": ...}` with the HTTPException's status and headers."""
    request = Request(scope, receive)
    try:
        response = await handle(request)
    except HTTPException as exc:
        response = Response(
            msgspec.json.encode({"detail": exc.detail}),
            exc.status_code,
            headers=exc.headers,
            media_type="application/json",
        )
    await response(scope, receive, send)


def _refuse(what: str, where: str, note: str = "") -> HTTPException:
    return HTTPException(422, f"invalid batch: {what} - at `{where}`{note}")


def _check_batch(batch: wire.Batch, now: float) -> None:
    """What the wire's bounds cannot say: timestamps within a window of the server's clock
    (a broken agent clock would otherwise poison every time-window query; the skew within
    the window is recorded per node), and integers within their database columns."""
    lo, hi = now - _MAX_PAST_S, now + _MAX_FUTURE_S

    def ts(value: float | None, where: str) -> None:
        if value is None or lo <= value <= hi:
            return
        raise _refuse(f"timestamp too far in the {'future' if value > hi else 'past'}", where)

    def num(value: int | None, limit: int, where: str) -> None:
        if value is not None and value > limit:
            raise _refuse("integer out of range", where, f" (at most {limit})")

    num(batch.seq, _INT64, "$.seq")
    ts(batch.sent_at, "$.sent_at")
    samples = batch.samples
    if samples:  # the hot path: one pass per field, the index only when something is off
        stamps = [s.ts for s in samples]
        if min(stamps) < lo or max(stamps) > hi:
            i = next(i for i, t in enumerate(stamps) if not lo <= t <= hi)
            ts(stamps[i], f"$.samples[{i}].ts")
    for i, e in enumerate(batch.events):
        ts(e.ts, f"$.events[{i}].ts")
    for i, st in enumerate(batch.steps):
        ts(st.start, f"$.steps[{i}].start")
        ts(st.end, f"$.steps[{i}].end")
        for f in ("step", "attempt", "iteration"):
            num(getattr(st, f), _INT32, f"$.steps[{i}].{f}")
    for i, r in enumerate(batch.ranks or ()):
        ts(r.last_heartbeat, f"$.ranks[{i}].last_heartbeat")
        for f in ("pid", "attempt", "iteration", "last_step"):
            num(getattr(r, f), _INT32, f"$.ranks[{i}].{f}")
