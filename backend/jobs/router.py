"""Jobs: reads, and the operator's manual restart."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Request

from trainguard.backend import errors
from trainguard.backend.auth import OperatorDep, ViewerDep
from trainguard.backend.db import SessionDep
from trainguard.backend.engine.queries import capabilities, launcher_budget
from trainguard.backend.incidents import publish, reads
from trainguard.backend.incidents import service as incidents
from trainguard.backend.incidents.schemas import Incident
from trainguard.backend.jobs import service
from trainguard.backend.jobs.schemas import Job, JobDetail, JobSteps, LaunchFailure, RestartRequest
from trainguard.backend.names import JobName

router = APIRouter(tags=["jobs"])


@router.get(
    "/jobs",
    summary="Every job, most recently active first",
    responses=errors.responses(*errors.VIEWER),
)
def list_jobs(session: SessionDep, _: ViewerDep) -> list[Job]:
    return [Job.model_validate(j) for j in service.list_jobs(session)]


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
    out["capabilities"] = capabilities(session, j.id, since)
    out.update(launcher_budget(session, j.id, since))
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


@router.post(
    "/jobs/{job}/restarts",
    status_code=202,
    summary="Ask for a restart of a job (operator; audited)",
    responses=errors.responses(
        *errors.OPERATOR,
        404,
        409,
        422,
        _404="unknown job",
        _409="no live ranks, a level the job cannot carry out, or a launcher restart that "
        "would use the launcher's last restart without force (code: restart_budget)",
    ),
)
def restart_job(
    job: JobName, body: RestartRequest, request: Request, session: SessionDep, who: OperatorDep
) -> Incident:
    j = service.get_job(session, job)
    incident = incidents.manual_restart(
        session,
        j,
        level=body.level,
        reason=body.reason,
        actor=who.name,
        fresh_within_s=request.app.state.settings.node_down_after_s,
        force=body.force,
    )
    publish.publish_on_commit(session, request.app.state.sessions, request.app.state.bus)
    request.app.state.commands_notifier.notify()
    return Incident.model_validate(reads.incident_dict(session, incident))


@router.post(
    "/jobs/{job}/launch-failures",
    status_code=201,
    summary="Say that a job does not start: its launcher gave up before it trained (operator)",
    responses=errors.responses(*errors.OPERATOR, 422),
)
def launch_failure(
    job: JobName, body: LaunchFailure, request: Request, session: SessionDep, who: OperatorDep
) -> Incident:
    incident = incidents.launch_failure(session, job, body.reason, actor=who.name)
    publish.publish_on_commit(session, request.app.state.sessions, request.app.state.bus)
    return Incident.model_validate(reads.incident_dict(session, incident))
