"""Jobs: reads (the operator's restart of a job is an incident's: incidents/router.py)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Request

from trainguard.backend import errors
from trainguard.backend.auth import ViewerDep
from trainguard.backend.db import SessionDep
from trainguard.backend.jobs import service, shape, timeouts
from trainguard.backend.jobs.schemas import Job, JobDetail, JobSteps
from trainguard.backend.names import JobName

router = APIRouter(tags=["jobs"])


@router.get(
    "/jobs",
    summary="Every job, most recently active first",
    responses=errors.responses(*errors.VIEWER),
)
def list_jobs(session: SessionDep, request: Request, _: ViewerDep) -> list[Job]:
    since = time.time() - request.app.state.settings.node_down_after_s
    spares = shape.spare_capacity(session, since)
    return [Job.model_validate(j) for j in service.list_jobs(session, spares)]


@router.get(
    "/jobs/{job}",
    summary="One job with its ranks and what it can carry out",
    responses=errors.responses(*errors.VIEWER, 404, 422, _404="unknown job"),
)
def get_job(job: JobName, request: Request, session: SessionDep, _: ViewerDep) -> JobDetail:
    j = service.get_job(session, job)
    out = service.job_dict(j)
    out["ranks"] = service.ranks(session, j)
    fresh = request.app.state.settings.node_down_after_s
    since = time.time() - fresh
    out["capabilities"] = service.capabilities(session, j.id, since)
    out.update(service.launcher_budget(session, j.id, since))
    out["timeout_warnings"] = timeouts.warnings(session, j.id, since)
    out["shape"] = shape.shape(session, j, since)
    out["spare_capacity"] = out["shape"]["spare_capacity"]
    return JobDetail.model_validate(out)


@router.get(
    "/jobs/{job}/steps",
    summary="Per-rank step timings, columnar, oldest first",
    responses=errors.responses(*errors.VIEWER, 404, 422, _404="unknown job"),
)
def job_steps(
    job: JobName,
    session: SessionDep,
    _: ViewerDep,
    since: Annotated[float | None, Query(ge=0)] = None,
    rank: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 5000,
) -> JobSteps:
    steps = service.steps(session, service.get_job(session, job), since, rank, limit)
    return JobSteps.model_validate(steps)
