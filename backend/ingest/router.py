"""POST /api/v1/ingest: decode with msgspec, hand to the group-commit writer, answer
when stored."""

from __future__ import annotations

import asyncio
import time

import msgspec
from fastapi import APIRouter, HTTPException, Request, Response

from agent import wire
from backend.auth import authorize, check_node

router = APIRouter(tags=["agents"])

_MAX_FUTURE_S = 24 * 3600.0  # timestamps more than this ahead of the server are refused


@router.post(
    "/ingest",
    summary="Store one agent batch (samples, events, steps, rank status)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": wire.json_schema(wire.Batch)}},
        }
    },
    responses={
        200: {"description": "stored (or a duplicate of a stored batch)"},
        413: {"description": "body too large"},
        422: {"description": "invalid batch; nothing was stored; the message names the field"},
        503: {"description": "database unavailable; retry"},
    },
)
async def ingest(request: Request) -> Response:
    principal = await authorize(request, "agent")
    limit: int = request.app.state.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"body of {declared} bytes exceeds the limit of {limit}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:  # a lying or absent Content-Length
            raise HTTPException(413, f"body exceeds the limit of {limit} bytes")
    try:
        batch = wire.decode_batch(bytes(body))
    except msgspec.ValidationError as exc:
        raise HTTPException(422, f"invalid batch: {exc}") from None
    except msgspec.DecodeError as exc:
        raise HTTPException(400, f"malformed JSON: {exc}") from None
    check_node(principal, batch.node)
    received_at = time.time()
    _check_times(batch, received_at)
    future = request.app.state.writer.submit(batch, received_at)
    result = await asyncio.wrap_future(future)  # database errors map to 503
    return Response(wire.encode(result), media_type="application/json")


def _check_times(batch: wire.Batch, now: float) -> None:
    """Refuse timestamps far in the future of the server's clock (a broken agent clock
    would otherwise poison every time-window query); the offset is recorded per node."""
    horizon = now + _MAX_FUTURE_S
    for name, items in (("samples", batch.samples), ("events", batch.events)):
        for i, item in enumerate(items):
            if item.ts > horizon:
                raise HTTPException(
                    422, f"invalid batch: timestamp too far in the future - at `$.{name}[{i}].ts`"
                )
