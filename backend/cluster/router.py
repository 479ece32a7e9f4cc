"""Read API of the cluster: nodes, GPUs, samples, events; cordon/uncordon."""

from __future__ import annotations

import logging
import time
from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Path, Query, Request

from trainguard.backend import audit, errors
from trainguard.backend.auth import OperatorDep, ViewerDep
from trainguard.backend.cluster import cordons, service
from trainguard.backend.cluster.schemas import (
    BackendEventKind,
    Cordon,
    CordonRequest,
    CordonState,
    Event,
    Gpu,
    GpuSeries,
    Node,
    NodeDetail,
)
from trainguard.backend.db import SessionDep
from trainguard.backend.errors import DomainError
from trainguard.backend.hooks import run_hook
from trainguard.backend.names import NodeName
from trainguard.protocol.wire import EventKind

log = logging.getLogger(__name__)

router = APIRouter(tags=["cluster"])


def _down_after(request: Request) -> float:
    return float(request.app.state.settings.node_down_after_s)


def _repair(request: Request) -> tuple[int, float]:
    r = request.app.state.settings.policy.model.readmission
    return int(r.repair_after), float(r.repair_window_s)


_NODE_ERRORS = errors.responses(*errors.VIEWER, 404, 422, _404="no such node")


@router.get(
    "/nodes",
    summary="Every node with its health and its current cordon",
    responses=errors.responses(*errors.VIEWER),
)
def list_nodes(request: Request, session: SessionDep, _: ViewerDep) -> list[Node]:
    nodes = service.list_nodes(session, _down_after(request), _repair(request))
    return [Node.model_validate(n) for n in nodes]


@router.get(
    "/nodes/{node}",
    summary="One node, with its GPUs and its current cordon",
    responses=_NODE_ERRORS,
)
def get_node(node: NodeName, request: Request, session: SessionDep, _: ViewerDep) -> NodeDetail:
    n = service.get_node(session, node)
    gpus = service.node_gpus(session, n)
    out = service.node_dict(n, len(gpus), time.time(), _down_after(request))
    out.update(service.cordon_info(session, [n.id], _repair(request)).get(n.id, {}))
    out["gpus"] = gpus
    return NodeDetail.model_validate(out)


@router.get(
    "/nodes/{node}/cordons",
    summary="A node's cordons, newest first: who or what, why, and its readmission",
    responses=_NODE_ERRORS,
)
def node_cordons(node: NodeName, session: SessionDep, _: ViewerDep) -> list[Cordon]:
    rows = cordons.history(session, service.get_node(session, node))
    return [Cordon.model_validate(c) for c in rows]


@router.get(
    "/nodes/{node}/gpus",
    summary="The GPUs of a node with their latest sample",
    responses=_NODE_ERRORS,
)
def node_gpus(node: NodeName, session: SessionDep, _: ViewerDep) -> list[Gpu]:
    return [
        Gpu.model_validate(g) for g in service.node_gpus(session, service.get_node(session, node))
    ]


@router.get(
    "/gpus/{uuid}/samples",
    summary="A GPU's samples, downsampled, columnar",
    responses=errors.responses(
        *errors.VIEWER, 400, 404, 422, _400="`since` is not before `until`", _404="no such GPU"
    ),
)
def gpu_samples(
    uuid: Annotated[str, Path(max_length=96)],
    session: SessionDep,
    _: ViewerDep,
    since: Annotated[
        float | None, Query(ge=0, description="Unix seconds; default until-600")
    ] = None,
    until: Annotated[float | None, Query(ge=0, description="Unix seconds; default now")] = None,
    points: Annotated[int, Query(ge=1, le=5000)] = 300,
) -> GpuSeries:
    until = time.time() if until is None else until
    since = until - 600 if since is None else since
    if since >= until:
        raise DomainError("`since` must be before `until`")
    return GpuSeries.model_validate(service.gpu_series(session, uuid, since, until, points))


@router.get(
    "/events",
    summary="Events, newest first",
    responses=errors.responses(*errors.VIEWER, 422),
)
def list_events(
    session: SessionDep,
    _: ViewerDep,
    node: Annotated[str | None, Query(max_length=128)] = None,
    kind: EventKind | BackendEventKind | None = None,
    job: Annotated[str | None, Query(max_length=128)] = None,
    since: Annotated[float | None, Query(ge=0)] = None,
    until: Annotated[float | None, Query(ge=0)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[Event]:
    events = service.list_events(session, node, kind, job, since, until, limit)
    return [Event.model_validate(e) for e in events]


def _uncordon_hook(request: Request, node: str, who: str) -> None:
    """hooks.uncordon (e.g. kubectl uncordon {node}), run after the response; its result
    is logged and audited."""
    policy = request.app.state.settings.policy
    template = policy.model.hooks.uncordon
    if not template:
        return
    result = run_hook("uncordon", template, {"node": node}, policy.model.hooks.timeout_s)
    log.log(
        logging.INFO if result.ok else logging.WARNING,
        "uncordon hook for %s (by %s): rc %s %s",
        node,
        who,
        result.rc,
        result.output[:200],
    )


@router.post(
    "/nodes/{node}/uncordon",
    summary="Readmit a cordoned node through the uncordon hook (operator; audited)",
    responses=errors.responses(*errors.OPERATOR, 404, 422, _404="no such node"),
)
def uncordon(
    node: NodeName,
    session: SessionDep,
    who: OperatorDep,
    request: Request,
    background: BackgroundTasks,
    body: CordonRequest | None = None,
) -> CordonState:
    n = service.get_node(session, node)
    reason = (body.reason if body else "") or "readmitted by an operator"
    now = time.time()
    changed = cordons.readmit(session, n, who.name, reason, now)
    if changed:
        background.add_task(_uncordon_hook, request, node, who.name)
    else:
        _audit(session, now, who.name, "uncordon", node, reason)  # was not cordoned
    return CordonState(name=node, cordoned=False, changed=changed)


def _audit(session: SessionDep, now: float, who: str, action: str, node: str, why: str) -> None:
    """Every operator action is audited, also one that changed nothing."""
    audit.record(session, ts=now, actor=who, action=action, target=f"node:{node}", reason=why)
