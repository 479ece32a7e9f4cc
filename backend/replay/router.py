"""`POST /api/v1/policy/replay` (operator): the period's recorded evidence through the
real engine under a candidate policy, beside the policy in force, on scratch databases;
nothing live is written and no command is sent (docs/replay.md)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from trainguard.backend import errors
from trainguard.backend.auth import OperatorDep
from trainguard.backend.db import SessionDep
from trainguard.backend.engine.policy import PolicyError, load_policy_text
from trainguard.backend.replay import service
from trainguard.backend.replay.schemas import ReplayReport, ReplayRequest

router = APIRouter()


@router.post(
    "/policy/replay",
    tags=["engine"],
    summary="Replay a period's evidence under a candidate policy",
    responses=errors.responses(*errors.OPERATOR, 413, 422),
)
def policy_replay(
    body: ReplayRequest, request: Request, session: SessionDep, _: OperatorDep
) -> ReplayReport:
    settings = request.app.state.settings
    try:
        candidate = load_policy_text(body.policy, "candidate")
    except PolicyError as exc:
        raise service.ReplayRefused(str(exc), code="bad_policy") from None
    until = body.until if body.until is not None else time.time()
    since = body.since if body.since is not None else until - (body.last_s or 0.0)
    tr = service.export(session, since, until, body.job)
    out = service.replay_under(settings, tr, candidate)
    return ReplayReport.model_validate(out)
