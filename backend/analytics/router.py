"""Analytics API: stragglers, goodput, checkpoint advice and the what-if calculator."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from trainguard.backend import errors
from trainguard.backend.analytics import advice, service
from trainguard.backend.analytics.schemas import (
    AdviceReport,
    GoodputReport,
    NodeStragglerReport,
    StragglerReport,
    WhatIf,
    WhatIfResult,
)
from trainguard.backend.auth import ViewerDep
from trainguard.backend.db import SessionDep
from trainguard.backend.errors import DomainError
from trainguard.backend.jobs.service import get_job
from trainguard.backend.names import JobName, NodeName

router = APIRouter(tags=["analytics"])

_JOB_ERRORS = errors.responses(*errors.VIEWER, 404, 422, _404="unknown job")


class InvalidInput(DomainError):
    status_code = 422


@router.get(
    "/jobs/{job}/stragglers",
    summary="Per-rank straggler scores and flags",
    responses=_JOB_ERRORS,
)
def job_stragglers(
    job: JobName, request: Request, session: SessionDep, _: ViewerDep
) -> StragglerReport:
    state = request.app.state
    report = service.straggler_report(
        session, get_job(session, job), state.straggler_config, state.analytics
    )
    return StragglerReport.model_validate(report)


@router.get(
    "/nodes/{node}/stragglers",
    summary="A node's straggler flags and its GPUs",
    responses=errors.responses(*errors.VIEWER, 404, 422, _404="no such node"),
)
def node_stragglers(node: NodeName, session: SessionDep, _: ViewerDep) -> NodeStragglerReport:
    return NodeStragglerReport.model_validate(service.node_straggler_report(session, node))


@router.get(
    "/jobs/{job}/goodput",
    summary="Goodput and badput buckets over a window",
    responses=_JOB_ERRORS,
)
def job_goodput(
    job: JobName,
    request: Request,
    session: SessionDep,
    _: ViewerDep,
    window: Literal["1h", "24h", "all"] = "all",
    until: Annotated[
        float | None, Query(ge=0, description="end of the window (default now)")
    ] = None,
    points: Annotated[int, Query(ge=1, le=500, description="bars in the series")] = 24,
) -> GoodputReport:
    settings = request.app.state.settings
    report = service.goodput_report(
        session, get_job(session, job), window, points, settings.goodput_idle_after_s, until
    )
    return GoodputReport.model_validate(report)


@router.get(
    "/jobs/{job}/advice",
    summary="MTBF, checkpoint cost and the recommended interval",
    responses=_JOB_ERRORS,
)
def job_advice(job: JobName, request: Request, session: SessionDep, _: ViewerDep) -> AdviceReport:
    settings = request.app.state.settings
    report = service.advice_report(
        session,
        get_job(session, job),
        settings.goodput_idle_after_s,
        settings.advice_mtbf_per_gpu_h * 3600,
    )
    return AdviceReport.model_validate(report)


@router.post(
    "/advice/whatif",
    summary="Expected goodput of a cluster (what-if calculator)",
    # `weights` only on the mix, as the calculator answers it.
    response_model_exclude_unset=True,
    responses=errors.responses(*errors.VIEWER, 422),
)
def whatif(body: WhatIf, _: ViewerDep) -> WhatIfResult:
    if body.level_mix is not None:
        # Checked here, not in a pydantic validator: the app's 422 handler cannot serialise
        # the exception a validator raises.
        unknown = sorted(set(body.level_mix) - set(body.restart_s))
        if unknown:
            raise InvalidInput(f"level_mix names levels without a restart time: {unknown}")
        if sum(body.level_mix.values()) <= 0:
            raise InvalidInput("level_mix weights must not all be zero")
    result = advice.whatif(
        gpus=body.gpus,
        mtbf_per_gpu_s=body.mtbf_per_gpu_h * 3600,
        checkpoint_cost_s=body.checkpoint_cost_s,
        restart_s={str(k): v for k, v in body.restart_s.items()},
        level_mix={str(k): v for k, v in body.level_mix.items()} if body.level_mix else None,
        interval_s=body.checkpoint_interval_s,
    )
    return WhatIfResult.model_validate(result)
