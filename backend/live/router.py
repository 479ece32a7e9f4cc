"""GET /api/v1/stream: Server-Sent Events, one stream per browser, filtered by topic."""

from __future__ import annotations

import re
from collections.abc import AsyncIterable
from typing import Annotated

import msgspec
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.sse import EventSourceResponse, ServerSentEvent

from trainguard.backend import errors
from trainguard.backend.auth import ViewerDep
from trainguard.backend.live.bus import CLOSED

router = APIRouter(tags=["live"])

_ONE_TOPIC = r"(nodes|events|incidents|(node|job):[A-Za-z0-9][A-Za-z0-9._:@-]{0,127})"
_TOPIC = re.compile(f"^{_ONE_TOPIC}$")
# The grammar of `topics` in the schema, so a generated value is one the stream takes; the
# check itself stays in parse_topics, which names the bad topics in its 422.
_TOPICS_PATTERN = f"^{_ONE_TOPIC}(,{_ONE_TOPIC}){{0,31}}$"
_json = msgspec.json.Encoder()


def parse_topics(
    topics: Annotated[
        str, Query(max_length=4096, json_schema_extra={"pattern": _TOPICS_PATTERN})
    ] = "nodes,events",
) -> frozenset[str]:
    """A dependency, so a bad `topics` is a 422 before the stream (and its 200) starts."""
    wanted = frozenset(t.strip() for t in topics.split(",") if t.strip())
    bad = sorted(t for t in wanted if not _TOPIC.match(t))
    if bad or not wanted or len(wanted) > 32:
        raise HTTPException(
            422,
            f"invalid topics {bad}: use nodes, events, incidents, node:<name>, job:<name> "
            "(comma-separated, at most 32)",
        )
    return wanted


@router.get(
    "/stream",
    response_class=EventSourceResponse,
    summary="Live updates (SSE); ?topics=nodes,events,node:<name>; ?access_token= accepted",
    description="Server-Sent Events: `hello` (the topics), then `nodes` (the node list, as "
    "GET /nodes), `event`, `command`, `incident` (as GET /incidents/{id}), `samples` "
    "(node:<name>) and `steps` (job:<name>), each `data` one JSON document.",
    responses=errors.responses(*errors.VIEWER, 422, _422="invalid `topics` (or parameters)"),
)
async def stream(
    request: Request,
    _: ViewerDep,
    wanted: Annotated[frozenset[str], Depends(parse_topics)],
    access_token: Annotated[str | None, Query(max_length=512)] = None,
) -> AsyncIterable[ServerSentEvent]:
    bus = request.app.state.bus
    sub = bus.subscribe(wanted)
    try:
        yield ServerSentEvent(event="hello", data={"topics": sorted(wanted)}, retry=2000)
        # Nodes now, so a fresh page needs no wait for the next tick.
        if "nodes" in wanted:
            nodes = await request.app.state.nodes_snapshot()
            yield ServerSentEvent(event="nodes", raw_data=_json.encode(nodes).decode())
        while True:
            item = await sub.queue.get()
            if item is CLOSED:  # the server stops: end the stream, the browser reconnects
                return
            name, data = item
            yield ServerSentEvent(event=name, raw_data=_json.encode(data).decode())
    finally:
        bus.unsubscribe(sub)
