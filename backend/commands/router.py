"""The agents' command channel (long-poll + phase acks) and the incident reads."""

from __future__ import annotations

import time
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, HTTPException, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import AfterValidator

from trainguard.backend import errors
from trainguard.backend.auth import AgentDep, ViewerDep, check_node
from trainguard.backend.commands import listing, service
from trainguard.backend.commands.schemas import AckResult, IncidentOut
from trainguard.backend.db import SessionDep
from trainguard.backend.engine.policy import ActionName
from trainguard.backend.models import Command, Incident
from trainguard.protocol import wire

router = APIRouter()

IncidentId = Annotated[int, Path(ge=1, le=2**31 - 1)]

_POLL_DB_EVERY_S = 0.5
_ack_decoder = msgspec.json.Decoder(wire.Ack)


@router.get(
    "/agents/{node}/commands",
    tags=["agents"],
    summary="Long-poll for this node's pending commands",
    responses={
        200: {
            "description": "the node's pending commands (empty when none came in `wait` s)",
            "content": {"application/json": {"schema": wire.json_schema(list[wire.Command])}},
        },
        **errors.responses(*errors.AGENT, 422),
    },
)
async def poll_commands(
    request: Request,
    principal: AgentDep,
    node: Annotated[str, Path(max_length=128)],
    wait: Annotated[float, Query(ge=0, le=60)] = 20.0,
) -> Response:
    check_node(principal, node)
    app = request.app
    wait = min(wait, app.state.settings.command_wait_max_s)
    deadline = time.monotonic() + wait

    def pending() -> list[wire.Command]:
        with app.state.sessions() as session:
            return service.pending_for_node(session, node)

    while True:
        cmds = await run_in_threadpool(pending)
        left = deadline - time.monotonic()
        if cmds or left <= 0 or await request.is_disconnected():
            return Response(wire.encode(cmds), media_type="application/json")
        await app.state.commands_notifier.wait(min(left, _POLL_DB_EVERY_S))


@router.post(
    "/commands/{command_id}/acks",
    tags=["agents"],
    summary="Acknowledge one phase of a command (idempotent per phase)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": wire.json_schema(wire.Ack)}},
        }
    },
    responses=errors.responses(
        *errors.AGENT, 400, 422, _400="malformed JSON", _422="invalid ack; nothing was stored"
    ),
)
async def ack_command(
    request: Request,
    principal: AgentDep,
    command_id: Annotated[str, Path(max_length=64)],
) -> AckResult:
    body = await request.body()
    try:
        ack = _ack_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise HTTPException(422, f"invalid ack: {exc}") from None
    except msgspec.DecodeError as exc:
        raise HTTPException(400, f"malformed JSON: {exc}") from None
    check_node(principal, ack.node)

    def store() -> tuple[bool, str | None, dict[str, Any] | None]:
        with request.app.state.sessions() as session:
            with session.begin():
                cmd = session.get(Command, command_id)
                inc = session.get(Incident, cmd.incident_id) if cmd and cmd.incident_id else None
                before = inc.status if inc else None
                fresh = service.record_ack(session, command_id, ack)
            after = service.incident_dict(session, inc) if inc is not None else None
            return fresh, before, after

    fresh, before, incident = await run_in_threadpool(store)
    request.app.state.bus.publish(
        "events", "command", {"command_id": command_id, "phase": ack.phase, "node": ack.node}
    )
    alerts = getattr(request.app.state, "alerts", None)
    if alerts is not None and incident is not None and incident["status"] != before:
        # resolved / failed happen here, on whichever replica took the ack.
        alerts.incident_changed(before, incident)
    return AckResult(ok=True, duplicate=not fresh)


def _check_cursor(token: str | None) -> str | None:
    if token is not None:
        listing.Cursor.decode(token)  # a ValueError answers 422 naming `cursor`
    return token


_PAGE_HEADERS = {
    "Link": {
        "description": 'RFC 8288 links to the adjacent pages: rel="next" (older incidents), '
        'rel="prev" (newer ones); each absent at that end of the list',
        "schema": {"type": "string"},
    },
    "X-Next-Cursor": {
        "description": "`cursor` of the next (older) page; absent on the last page",
        "schema": {"type": "string"},
    },
    "X-Prev-Cursor": {
        "description": "`cursor` of the previous (newer) page; absent on the first page",
        "schema": {"type": "string"},
    },
}


@router.get(
    "/incidents",
    tags=["incidents"],
    summary="Incidents, newest first, a page at a time",
    description="Keyset pages by id: rows inserted while a client pages appear on the "
    "first page only. The adjacent pages are in the Link and X-Next-Cursor / "
    "X-Prev-Cursor headers; the body stays a plain list.",
    responses={
        200: {"headers": _PAGE_HEADERS},
        **errors.responses(*errors.VIEWER, 422),
    },
)
def list_incidents(
    request: Request,
    response: Response,
    session: SessionDep,
    _: ViewerDep,
    job: Annotated[str | None, Query(max_length=128, description="job name")] = None,
    node: Annotated[str | None, Query(max_length=128, description="the fault's node")] = None,
    status: listing.IncidentStatus | None = None,
    level: Annotated[ActionName | None, Query(description="the action taken")] = None,
    since: Annotated[float | None, Query(ge=0, description="created at or after (unix s)")] = None,
    cursor: Annotated[
        str | None,
        Query(max_length=64, description="from X-Next-Cursor / X-Prev-Cursor"),
        AfterValidator(_check_cursor),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[IncidentOut]:
    filters = listing.IncidentFilters(job, node, status, level, since)
    page = listing.list_incidents(
        session, filters, listing.Cursor.decode(cursor) if cursor else None, limit
    )
    links = []
    for rel, header, at in (
        ("next", "X-Next-Cursor", page.older),
        ("prev", "X-Prev-Cursor", page.newer),
    ):
        if at is not None:
            token = at.encode()
            response.headers[header] = token
            # A relative reference (the query only): right behind any proxy or path prefix.
            links.append(f'<?{request.url.include_query_params(cursor=token).query}>; rel="{rel}"')
    if links:
        response.headers["Link"] = ", ".join(links)
    return [IncidentOut.model_validate(inc) for inc in page.items]


@router.get(
    "/incidents/{incident_id}",
    tags=["incidents"],
    summary="One incident's timeline",
    responses=errors.responses(*errors.VIEWER, 404, 422, _404="no such incident"),
)
def get_incident(incident_id: IncidentId, session: SessionDep, _: ViewerDep) -> IncidentOut:
    inc = service.incident_dict(session, service.get_incident(session, incident_id))
    return IncidentOut.model_validate(inc)
