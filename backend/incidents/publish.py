"""The one place incident changes reach the live bus (topic `incidents`, event
`incident`, the incident as GET /api/v1/incidents/{id} gives it).

Every transition in service.py marks its incident as changed in its session
(`changed`); whoever commits that session publishes the marked incidents once each,
after the commit, so a browser that reloads on the event reads the change: the engine
after each of its transactions, a request through `publish_on_commit`, the agents' ack
route after its own transaction. A transaction rolled back publishes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from trainguard.backend.incidents.reads import get_incident, incident_dict
from trainguard.backend.live.bus import LiveBus
from trainguard.backend.models import Incident

_CHANGED = "trainguard.incidents.changed"


def changed(session: Session, inc: Incident) -> None:
    """Mark an incident as changed by this session's transaction."""
    session.info.setdefault(_CHANGED, set()).add(inc.id)


def take(session: Session) -> set[int]:
    """The ids of the incidents this session changed since the last take (and forget them)."""
    ids: set[int] = session.info.pop(_CHANGED, set())
    return ids


def publish(
    sessions: sessionmaker[Session],
    bus: LiveBus | None,
    incident_ids: Iterable[int],
    also: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Publish committed incidents on the bus, each once, and hand each to `also` (the
    engine's and the ack route's alert webhooks). Best effort, like the bus itself: a
    browser that missed one reloads from the REST API."""
    ids = sorted(set(incident_ids))
    wants_bus = bus is not None and bus.wants("incidents")
    if not ids or (not wants_bus and also is None):
        return
    with contextlib.suppress(Exception), sessions() as s:
        for iid in ids:
            inc = incident_dict(s, get_incident(s, iid))
            if wants_bus:
                assert bus is not None
                bus.publish("incidents", "incident", inc)
            if also is not None:
                also(inc)


def publish_on_commit(
    session: Session, sessions: sessionmaker[Session], bus: LiveBus | None
) -> None:
    """Publish what this request's session changes once it commits (a request's session
    commits after its route returned: db.get_session)."""

    def after_commit(s: Session) -> None:
        publish(sessions, bus, take(s))

    event.listen(session, "after_commit", after_commit, once=True)
