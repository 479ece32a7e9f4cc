"""The incident list: filters and keyset pagination (id descending, newest first).

A page is read after (`older`) or before (`newer`) the id its cursor carries, so rows
inserted meanwhile never shift a later page: new incidents appear on the first page only.
The cursor is opaque to clients (base64url of "o:<id>" / "n:<id>"); they pass back what
the previous answer gave.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Literal, get_args

from sqlalchemy import ColumnElement, exists, select
from sqlalchemy.orm import Session

from trainguard.backend.incidents.reads import incident_dict
from trainguard.backend.models import Incident, Job, Node
from trainguard.backend.models.control import ACTION_NAMES, INCIDENT_STATUSES, ActionName

IncidentStatus = Literal["open", "pending", "resolved", "failed", "rejected", "stopped"]
assert get_args(IncidentStatus) == INCIDENT_STATUSES
assert get_args(ActionName) == ACTION_NAMES

_MAX_ID = 2**31  # ids are int32; a cursor may sit one past the last
Direction = Literal["older", "newer"]
_PREFIX: dict[Direction, str] = {"older": "o", "newer": "n"}
_DIRECTION: dict[str, Direction] = {v: k for k, v in _PREFIX.items()}


@dataclass(frozen=True)
class Cursor:
    """`older`: the rows with an id below `id`; `newer`: the rows with an id above it."""

    direction: Direction
    id: int

    def encode(self) -> str:
        raw = f"{_PREFIX[self.direction]}:{self.id}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str) -> Cursor:
        """The cursor a previous answer gave; ValueError for anything else."""
        try:
            padded = token + "=" * (-len(token) % 4)
            raw = base64.b64decode(padded, altchars=b"-_", validate=True).decode("ascii")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raw = ""
        prefix, _, number = raw.partition(":")
        if prefix not in _DIRECTION or not number.isdigit() or int(number) > _MAX_ID:
            raise ValueError(
                "not a cursor of this list: pass back the X-Next-Cursor or X-Prev-Cursor "
                "value (or the Link URL) of a previous answer unchanged"
            )
        return cls(_DIRECTION[prefix], int(number))


@dataclass(frozen=True)
class IncidentFilters:
    job: str | None = None
    node: str | None = None  # the node of the fault (Incident.node_id)
    status: IncidentStatus | None = None
    level: ActionName | None = None
    since: float | None = None  # created_at >= since (unix seconds)

    def where(self) -> list[ColumnElement[bool]]:
        out: list[ColumnElement[bool]] = []
        if self.job is not None:
            out.append(
                Incident.job_id == select(Job.id).where(Job.name == self.job).scalar_subquery()
            )
        if self.node is not None:
            out.append(
                Incident.node_id == select(Node.id).where(Node.name == self.node).scalar_subquery()
            )
        if self.status is not None:
            out.append(Incident.status == self.status)
        if self.level is not None:
            out.append(Incident.level == self.level)
        if self.since is not None:
            out.append(Incident.created_at >= self.since)
        return out


@dataclass(frozen=True)
class IncidentPage:
    items: list[dict[str, Any]]  # newest first
    older: Cursor | None  # the next page (rel="next"), None at the oldest end
    newer: Cursor | None  # the previous page (rel="prev"), None on the first page


def _any(session: Session, where: list[ColumnElement[bool]]) -> bool:
    return bool(session.scalar(select(exists().where(*where))))


def list_incidents(
    session: Session, filters: IncidentFilters, cursor: Cursor | None, limit: int
) -> IncidentPage:
    where = filters.where()
    stmt = select(Incident).where(*where)
    if cursor is not None and cursor.direction == "newer":
        rows = list(
            session.scalars(
                stmt.where(Incident.id > cursor.id).order_by(Incident.id.asc()).limit(limit + 1)
            )
        )
        more_newer = len(rows) > limit
        rows = rows[:limit][::-1]
        more_older = _any(session, [*where, Incident.id <= cursor.id])
    else:
        if cursor is not None:
            stmt = stmt.where(Incident.id < cursor.id)
        rows = list(session.scalars(stmt.order_by(Incident.id.desc()).limit(limit + 1)))
        more_older = len(rows) > limit
        rows = rows[:limit]
        more_newer = cursor is not None and _any(session, [*where, Incident.id >= cursor.id])
    if rows:
        oldest, newest = rows[-1].id, rows[0].id
    elif cursor is not None:  # past either end: lead back to the rows beside the cursor
        oldest, newest = cursor.id + 1, cursor.id - 1
    else:
        oldest = newest = 0  # nothing matches: no page either way
    return IncidentPage(
        items=[incident_dict(session, i) for i in rows],
        older=Cursor("older", oldest) if more_older else None,
        newer=Cursor("newer", newest) if more_newer else None,
    )
