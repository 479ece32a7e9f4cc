"""The agents' command channel (long-poll + phase acks) and the incident reads."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import msgspec
from fastapi import APIRouter, HTTPException, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from trainguard.backend.auth import AgentDep, ViewerDep, check_node
from trainguard.backend.commands import service
from trainguard.backend.db import SessionDep
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
)
async def ack_command(
    request: Request,
    principal: AgentDep,
    command_id: Annotated[str, Path(max_length=64)],
) -> dict[str, Any]:
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
    return {"ok": True, "duplicate": not fresh}


@router.get("/incidents", tags=["incidents"], summary="Incidents, newest first")
def list_incidents(
    session: SessionDep,
    _: ViewerDep,
    job: Annotated[str | None, Query(max_length=128)] = None,
    status: Literal["open", "pending", "resolved", "failed", "rejected", "stopped"] | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    return service.list_incidents(session, job, status, limit)


@router.get("/incidents/{incident_id}", tags=["incidents"], summary="One incident's timeline")
def get_incident(incident_id: IncidentId, session: SessionDep, _: ViewerDep) -> dict[str, Any]:
    return service.incident_dict(session, service.get_incident(session, incident_id))
