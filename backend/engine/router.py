"""The engine's REST surface: its status (viewer) and the operator's answer to a dry-run
recommendation (approve / reject, audited with the reason)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Path, Request
from sqlalchemy import event

from trainguard.backend import errors
from trainguard.backend.auth import OperatorDep, Principal, ViewerDep
from trainguard.backend.commands import service as commands
from trainguard.backend.commands.schemas import IncidentOut
from trainguard.backend.db import SessionDep
from trainguard.backend.engine.schemas import Answer, EngineStatus
from trainguard.backend.errors import Conflict
from trainguard.backend.models import AuditLog, Incident

router = APIRouter()

IncidentId = Annotated[int, Path(ge=1, le=2**31 - 1)]


@router.get(
    "/engine",
    tags=["engine"],
    summary="Decision engine: leader, policy, activity",
    # The fields the engine reports, no nulls for those it does not (engine off).
    response_model_exclude_unset=True,
    responses=errors.responses(*errors.VIEWER),
)
def engine_status(request: Request, _: ViewerDep) -> EngineStatus:
    engine = getattr(request.app.state, "decision_engine", None)
    if engine is None:
        return EngineStatus(enabled=False, leader=False, detail="TRAINGUARD_ENGINE_ENABLED is off")
    return EngineStatus.model_validate(engine.status())


def _pending(session: SessionDep, incident_id: int) -> Incident:
    inc = session.get(Incident, incident_id, with_for_update=True, populate_existing=True)
    if inc is None:
        commands.get_incident(session, incident_id)  # raises NotFound
        raise AssertionError
    if inc.status != "pending":
        raise Conflict(f"incident {incident_id} is {inc.status}, not awaiting approval")
    return inc


@router.post(
    "/incidents/{incident_id}/approve",
    tags=["incidents"],
    status_code=202,
    summary="Approve a dry-run recommendation: the engine carries it out (operator; audited)",
    responses=errors.responses(
        *errors.OPERATOR, 404, 409, 422, _404="no such incident", _409="not pending"
    ),
)
def approve(
    incident_id: IncidentId, body: Answer, request: Request, session: SessionDep, who: OperatorDep
) -> IncidentOut:
    inc = _pending(session, incident_id)
    now = _record_answer(session, inc, who, body.reason, "approval", "approve")
    inc.status = "open"
    inc.not_before = now  # the leader's engine acts on it at its next cycle
    inc.outcome = f"approved by {who.name}"
    session.flush()
    _wake_engine(request, session)
    return IncidentOut.model_validate(commands.incident_dict(session, inc))


@router.post(
    "/incidents/{incident_id}/reject",
    tags=["incidents"],
    summary="Reject a dry-run recommendation (operator; audited)",
    responses=errors.responses(
        *errors.OPERATOR, 404, 409, 422, _404="no such incident", _409="not pending"
    ),
)
def reject(
    incident_id: IncidentId, body: Answer, session: SessionDep, who: OperatorDep
) -> IncidentOut:
    inc = _pending(session, incident_id)
    now = _record_answer(session, inc, who, body.reason, "rejection", "reject")
    inc.status = "rejected"
    inc.closed_at = now
    inc.outcome = f"rejected by {who.name}: {body.reason}"
    session.flush()
    return IncidentOut.model_validate(commands.incident_dict(session, inc))


def _record_answer(
    session: SessionDep, inc: Incident, who: Principal, reason: str, mode: str, verb: str
) -> float:
    """An operator's answer to a recommendation: a decision entry and an audit row."""
    now = time.time()
    inc.decisions = [
        *inc.decisions,
        {"at": now, "level": inc.level, "why": reason, "by": who.name, "mode": mode},
    ]
    session.add(
        AuditLog(
            ts=now,
            actor=who.name,
            action=f"{verb}:{inc.level}",
            target=f"incident:{inc.id}",
            reason=reason,
        )
    )
    return now


def _wake_engine(request: Request, session: SessionDep) -> None:
    """The engine reads the approval after this request's commit: wake it then."""
    engine = getattr(request.app.state, "decision_engine", None)
    if engine is None:
        return
    event.listen(session, "after_commit", lambda _s: engine.wake(), once=True)
