"""The agents' command channel: long-poll for a node's commands, phase acks."""

from __future__ import annotations

import time
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, HTTPException, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from trainguard.backend import errors
from trainguard.backend.auth import AgentDep, check_node
from trainguard.backend.commands import service
from trainguard.backend.commands.schemas import AckResult
from trainguard.backend.incidents import acks, publish
from trainguard.backend.models import Command, Incident
from trainguard.backend.names import NodeName
from trainguard.protocol import wire

router = APIRouter()

_POLL_DB_EVERY_S = 0.5
SHUTTING_DOWN = "server shutting down, retry"
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
        **errors.responses(
            *errors.AGENT,
            422,
            _503="database unavailable, or the server is shutting down; poll again after "
            "Retry-After",
        ),
    },
)
async def poll_commands(
    request: Request,
    principal: AgentDep,
    node: NodeName,
    wait: Annotated[
        float,
        Query(
            ge=0,
            le=60,
            description="seconds to wait for a command; capped at the server's "
            "`command_wait_max_s` (TRAINGUARD_COMMAND_WAIT_MAX_S, default 30)",
        ),
    ] = 20.0,
) -> Response:
    check_node(principal, node)
    app = request.app
    wait = min(wait, app.state.settings.command_wait_max_s)
    deadline = time.monotonic() + wait

    def pending() -> list[wire.Command]:
        with app.state.sessions() as session:
            return service.pending_for_node(session, node)

    notifier = app.state.commands_notifier
    while True:
        cmds = await run_in_threadpool(pending)
        left = deadline - time.monotonic()
        if cmds or left <= 0 or await request.is_disconnected():
            return Response(wire.encode(cmds), media_type="application/json")
        if notifier.closing:  # the server stops: the agent polls again (another replica)
            raise HTTPException(503, SHUTTING_DOWN, headers={"Retry-After": "1"})
        await notifier.wait(min(left, _POLL_DB_EVERY_S))


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
        *errors.AGENT,
        400,
        404,
        409,
        422,
        _400="malformed JSON",
        _404="unknown command",
        _409="the command is addressed to another node",
        _422="invalid ack; nothing was stored",
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

    app = request.app

    def store() -> bool:
        with app.state.sessions() as session:
            with session.begin():
                cmd = session.get(Command, command_id)
                inc = session.get(Incident, cmd.incident_id) if cmd and cmd.incident_id else None
                before = inc.status if inc else None
                fresh = acks.record_ack(session, command_id, ack)
            changed = publish.take(session)
        app.state.bus.publish(
            "events", "command", {"command_id": command_id, "phase": ack.phase, "node": ack.node}
        )
        alerts = getattr(app.state, "alerts", None)

        def alert(incident: dict[str, Any]) -> None:
            if alerts is not None and incident["status"] != before:
                # resolved / failed happen here, on whichever replica took the ack.
                alerts.incident_changed(before, incident)

        publish.publish(app.state.sessions, app.state.bus, changed, alert)
        return fresh

    fresh = await run_in_threadpool(store)
    return AckResult(ok=True, duplicate=not fresh)
