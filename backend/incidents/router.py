"""The incident routes: reads (the list, a page at a time, and one incident), the
operator's answer to a dry-run recommendation (approve / reject, audited with the reason),
and the incidents an operator opens about a job: a manual restart, a job that does not
start (under /jobs/{job}, tagged `jobs`)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import AfterValidator
from sqlalchemy import event

from trainguard.backend import audit, errors
from trainguard.backend.auth import OperatorDep, ViewerDep
from trainguard.backend.cluster import service as cluster
from trainguard.backend.cluster.schemas import CordonRequest, CordonState
from trainguard.backend.db import SessionDep
from trainguard.backend.incidents import listing, operators, publish, reads
from trainguard.backend.incidents.schemas import Answer, Incident, IncidentOut
from trainguard.backend.jobs import service as jobs
from trainguard.backend.jobs.schemas import LaunchFailure, RestartRequest
from trainguard.backend.models.control import ActionName
from trainguard.backend.names import JobName, NodeName

router = APIRouter(tags=["incidents"])

IncidentId = Annotated[int, Path(ge=1, le=2**31 - 1)]


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
    summary="One incident's timeline",
    responses=errors.responses(*errors.VIEWER, 404, 422, _404="no such incident"),
)
def get_incident(incident_id: IncidentId, session: SessionDep, _: ViewerDep) -> IncidentOut:
    inc = reads.incident_dict(session, reads.get_incident(session, incident_id))
    return IncidentOut.model_validate(inc)


@router.post(
    "/incidents/{incident_id}/approve",
    status_code=202,
    summary="Approve a dry-run recommendation: the engine carries it out (operator; audited)",
    responses=errors.responses(
        *errors.OPERATOR, 404, 409, 422, _404="no such incident", _409="not pending"
    ),
)
def approve(
    incident_id: IncidentId, body: Answer, request: Request, session: SessionDep, who: OperatorDep
) -> IncidentOut:
    inc = operators.approve(session, incident_id, who.name, body.reason)
    publish.publish_on_commit(session, request.app.state.sessions, request.app.state.bus)
    _wake_engine(request, session)
    return IncidentOut.model_validate(reads.incident_dict(session, inc))


@router.post(
    "/incidents/{incident_id}/reject",
    summary="Reject a dry-run recommendation (operator; audited)",
    responses=errors.responses(
        *errors.OPERATOR, 404, 409, 422, _404="no such incident", _409="not pending"
    ),
)
def reject(
    incident_id: IncidentId, body: Answer, request: Request, session: SessionDep, who: OperatorDep
) -> IncidentOut:
    inc = operators.reject(session, incident_id, who.name, body.reason)
    publish.publish_on_commit(session, request.app.state.sessions, request.app.state.bus)
    return IncidentOut.model_validate(reads.incident_dict(session, inc))


def _wake_engine(request: Request, session: SessionDep) -> None:
    """The engine reads the approval after this request's commit: wake it then."""
    engine = getattr(request.app.state, "decision_engine", None)
    if engine is None:
        return
    event.listen(session, "after_commit", lambda _s: engine.wake(), once=True)


@router.post(
    "/jobs/{job}/restarts",
    tags=["jobs"],
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
    j = jobs.get_job(session, job)
    incident = operators.manual_restart(
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
    tags=["jobs"],
    status_code=201,
    summary="Say that a job does not start: its launcher gave up before it trained (operator)",
    responses=errors.responses(*errors.OPERATOR, 422),
)
def launch_failure(
    job: JobName, body: LaunchFailure, request: Request, session: SessionDep, who: OperatorDep
) -> Incident:
    incident = operators.launch_failure(session, job, body.reason, actor=who.name)
    publish.publish_on_commit(session, request.app.state.sessions, request.app.state.bus)
    return Incident.model_validate(reads.incident_dict(session, incident))


@router.post(
    "/nodes/{node}/cordon",
    tags=["cluster"],
    summary="Cordon a node (no new work; audited); with live ranks, take it out of their jobs",
    responses=errors.responses(
        *errors.OPERATOR,
        404,
        409,
        422,
        _404="no such node",
        _409="the node hosts live ranks and force is not set (code: live_ranks)",
    ),
)
def cordon(
    node: NodeName,
    session: SessionDep,
    who: OperatorDep,
    request: Request,
    body: CordonRequest | None = None,
) -> CordonState:
    """No new work on the node. A node with live ranks also leaves their jobs, as an
    exclusion does (an incident per job, docs/engine.md "A node leaves the job"), which
    needs `force`; here, the cordon of an incident-free node is this alone."""
    n = cluster.get_node(session, node)
    reason = (body.reason if body else "") or "cordoned by an operator"
    state = request.app.state
    changed, opened = operators.cordon_node(
        session,
        n,
        who.name,
        reason,
        force=bool(body and body.force),
        fresh_within_s=state.settings.node_down_after_s,
        leave_grace_s=state.settings.policy.model.escalation.leave_grace_s,
    )
    if not changed:  # already cordoned: nothing done but the audit
        audit.record(
            session,
            ts=time.time(),
            actor=who.name,
            action="cordon",
            target=f"node:{node}",
            reason=reason,
        )
    if opened:
        publish.publish_on_commit(session, state.sessions, state.bus)
        state.commands_notifier.notify()
    return CordonState(name=node, cordoned=True, changed=changed, incidents=[i.id for i in opened])
