"""Read API of the cluster: nodes, GPUs, samples, events; cordon/uncordon."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field

from agent.wire import EventKind
from backend.auth import OperatorDep, ViewerDep
from backend.cluster import service
from backend.db import SessionDep
from backend.errors import DomainError
from backend.models import AuditLog

router = APIRouter(tags=["cluster"])

NodeName = Annotated[str, Path(max_length=128)]


def _down_after(request: Request) -> float:
    return float(request.app.state.settings.node_down_after_s)


@router.get("/nodes", summary="Every node with its health")
def list_nodes(request: Request, session: SessionDep, _: ViewerDep) -> list[dict[str, Any]]:
    return service.list_nodes(session, _down_after(request))


@router.get("/nodes/{node}", summary="One node, with its GPUs")
def get_node(node: NodeName, request: Request, session: SessionDep, _: ViewerDep) -> dict[str, Any]:
    n = service.get_node(session, node)
    gpus = service.node_gpus(session, n)
    out = service.node_dict(n, len(gpus), time.time(), _down_after(request))
    out["gpus"] = gpus
    return out


@router.get("/nodes/{node}/gpus", summary="The GPUs of a node with their latest sample")
def node_gpus(node: NodeName, session: SessionDep, _: ViewerDep) -> list[dict[str, Any]]:
    return service.node_gpus(session, service.get_node(session, node))


@router.get("/gpus/{uuid}/samples", summary="A GPU's samples, downsampled, columnar")
def gpu_samples(
    uuid: Annotated[str, Path(max_length=96)],
    session: SessionDep,
    _: ViewerDep,
    since: Annotated[
        float | None, Query(ge=0, description="Unix seconds; default until-600")
    ] = None,
    until: Annotated[float | None, Query(ge=0, description="Unix seconds; default now")] = None,
    points: Annotated[int, Query(ge=1, le=5000)] = 300,
) -> dict[str, Any]:
    until = time.time() if until is None else until
    since = until - 600 if since is None else since
    if since >= until:
        raise DomainError("`since` must be before `until`")
    return service.gpu_series(session, uuid, since, until, points)


@router.get("/events", summary="Events, newest first")
def list_events(
    session: SessionDep,
    _: ViewerDep,
    node: Annotated[str | None, Query(max_length=128)] = None,
    kind: EventKind | None = None,
    job: Annotated[str | None, Query(max_length=128)] = None,
    since: Annotated[float | None, Query(ge=0)] = None,
    until: Annotated[float | None, Query(ge=0)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    return service.list_events(session, node, kind, job, since, until, limit)


class CordonRequest(BaseModel):
    model_config = {"extra": "forbid"}
    reason: str = Field(default="", max_length=500)


def _set_cordon(session: SessionDep, node: str, who: str, on: bool, reason: str) -> dict[str, Any]:
    n = service.get_node(session, node)
    n.cordoned = on
    session.add(
        AuditLog(
            ts=time.time(),
            actor=who,
            action="cordon" if on else "uncordon",
            target=f"node:{node}",
            reason=reason,
        )
    )
    return {"name": node, "cordoned": on}


@router.post("/nodes/{node}/cordon", summary="Cordon a node (no new work; audited)")
def cordon(
    node: NodeName, session: SessionDep, who: OperatorDep, body: CordonRequest | None = None
) -> dict[str, Any]:
    return _set_cordon(session, node, who.name, True, body.reason if body else "")


@router.post("/nodes/{node}/uncordon", summary="Uncordon a node (audited)")
def uncordon(
    node: NodeName, session: SessionDep, who: OperatorDep, body: CordonRequest | None = None
) -> dict[str, Any]:
    return _set_cordon(session, node, who.name, False, body.reason if body else "")
