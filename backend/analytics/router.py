"""Analytics API: stragglers, goodput, checkpoint advice and the what-if calculator."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field

from trainguard.backend.analytics import advice, service
from trainguard.backend.auth import ViewerDep
from trainguard.backend.db import SessionDep
from trainguard.backend.errors import DomainError
from trainguard.backend.jobs.service import get_job

router = APIRouter(tags=["analytics"])

JobName = Annotated[str, Path(max_length=128)]
NodeName = Annotated[str, Path(max_length=128)]
Level = Literal["in_process", "launcher", "exclude_node", "stop_job"]


class InvalidInput(DomainError):
    status_code = 422


@router.get("/jobs/{job}/stragglers", summary="Per-rank straggler scores and flags")
def job_stragglers(
    job: JobName, request: Request, session: SessionDep, _: ViewerDep
) -> dict[str, Any]:
    state = request.app.state
    return service.straggler_report(
        session, get_job(session, job), state.straggler_config, state.analytics
    )


@router.get("/nodes/{node}/stragglers", summary="A node's straggler flags and its GPUs")
def node_stragglers(node: NodeName, session: SessionDep, _: ViewerDep) -> dict[str, Any]:
    return service.node_straggler_report(session, node)


@router.get("/jobs/{job}/goodput", summary="Goodput and badput buckets over a window")
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
) -> dict[str, Any]:
    settings = request.app.state.settings
    return service.goodput_report(
        session, get_job(session, job), window, points, settings.goodput_idle_after_s, until
    )


@router.get("/jobs/{job}/advice", summary="MTBF, checkpoint cost and the recommended interval")
def job_advice(job: JobName, request: Request, session: SessionDep, _: ViewerDep) -> dict[str, Any]:
    settings = request.app.state.settings
    return service.advice_report(
        session,
        get_job(session, job),
        settings.goodput_idle_after_s,
        settings.advice_mtbf_per_gpu_h * 3600,
    )


class WhatIf(BaseModel):
    model_config = {"extra": "forbid"}
    gpus: int = Field(ge=1, le=10_000_000, description="GPUs in the job")
    mtbf_per_gpu_h: float = Field(
        default=advice.LLAMA3_MTBF_PER_GPU_S / 3600,
        gt=0,
        description="mean time between failures of one GPU (default: Llama 3's rate)",
    )
    checkpoint_cost_s: float = Field(gt=0, le=86400, description="blocking time of a save")
    checkpoint_interval_s: float | None = Field(
        default=None, gt=0, description="interval to evaluate (default: Daly's optimum)"
    )
    restart_s: dict[Level, Annotated[float, Field(ge=0, le=86400)]] = Field(
        min_length=1, description="restart time per level, fault to resumed"
    )
    level_mix: dict[Level, Annotated[float, Field(ge=0)]] | None = Field(
        default=None, description="share of failures recovered at each level"
    )


@router.post("/advice/whatif", summary="Expected goodput of a cluster (what-if calculator)")
def whatif(body: WhatIf, _: ViewerDep) -> dict[str, Any]:
    if body.level_mix is not None:
        # Checked here, not in a pydantic validator: the app's 422 handler cannot serialise
        # the exception a validator raises.
        unknown = sorted(set(body.level_mix) - set(body.restart_s))
        if unknown:
            raise InvalidInput(f"level_mix names levels without a restart time: {unknown}")
        if sum(body.level_mix.values()) <= 0:
            raise InvalidInput("level_mix weights must not all be zero")
    return advice.whatif(
        gpus=body.gpus,
        mtbf_per_gpu_s=body.mtbf_per_gpu_h * 3600,
        checkpoint_cost_s=body.checkpoint_cost_s,
        restart_s={str(k): v for k, v in body.restart_s.items()},
        level_mix={str(k): v for k, v in body.level_mix.items()} if body.level_mix else None,
        interval_s=body.checkpoint_interval_s,
    )
