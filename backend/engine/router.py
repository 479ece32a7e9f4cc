"""The engine's REST surface: its status (viewer). The operator's answers to its dry-run
recommendations are incident routes (incidents/router.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from trainguard.backend import errors
from trainguard.backend.auth import ViewerDep
from trainguard.backend.engine.schemas import EngineStatus

router = APIRouter()


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
