"""The operator's `trainguard` commands (pyproject.toml, `trainguard.commands`): restart a
job, list and show incidents, approve or reject a dry-run recommendation, cordon and
uncordon a node. Each prints a table, or the result as JSON with `--json`.

The server and the token come from `--server` / TRAINGUARD_SERVER and `--token` /
TRAINGUARD_TOKEN. A failure prints one line and exits 1 (2 for a usage mistake); httpx is
imported only when a command runs, so a missing extra is a line too, not a traceback."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Literal, NoReturn, TypeVar

import msgspec
import typer

from trainguard.client import render
from trainguard.client.models import (
    DEFAULT_SERVER,
    ClientError,
    Incident,
    NodeCordon,
    RestartLevel,
)

if TYPE_CHECKING:
    from trainguard.client.api import Client

T = TypeVar("T")

Server = Annotated[
    str,
    typer.Option("--server", envvar="TRAINGUARD_SERVER", help="backend URL", show_default=True),
]
Token = Annotated[
    str | None,
    typer.Option("--token", envvar="TRAINGUARD_TOKEN", help="operator token (viewer for reads)"),
]
Json = Annotated[bool, typer.Option("--json", help="print the result as JSON, for scripts")]
IncidentId = Annotated[int, typer.Argument(min=1, help="incident id")]
Status = Literal["open", "pending", "resolved", "failed", "rejected", "stopped"]


def fail(message: str, code: int) -> NoReturn:
    typer.echo(f"trainguard: {message}", err=True)
    raise typer.Exit(code)


def call(server: str, token: str | None, action: Callable[[Client], T]) -> T:
    """`action` on a client of `server`; every failure is one line on stderr."""
    if not token:
        fail("no token: --token or TRAINGUARD_TOKEN", 2)
    try:
        from trainguard.client.api import Client
    except ModuleNotFoundError as exc:
        if exc.name != "httpx":
            raise
        fail("the operator commands need httpx: pip install 'trainguard[agent]'", 2)
    try:
        with Client(server, token) as client:
            return action(client)
    except ClientError as exc:
        fail(str(exc), 1)


def show(result: Incident | NodeCordon | list[Incident], as_json: bool, text: str) -> None:
    typer.echo(msgspec.json.encode(result).decode() if as_json else text)


def restart(
    job: Annotated[str, typer.Argument(help="job name")],
    level: Annotated[RestartLevel, typer.Option(help="restart level")],
    reason: Annotated[str, typer.Option(help="why (audited)")],
    server: Server = DEFAULT_SERVER,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """Restart a job at a level; prints the incident that carries it."""
    inc = call(server, token, lambda c: c.restart(job, level, reason))
    show(inc, as_json, f"incident {inc.id}: {inc.level} restart of {inc.job} ({inc.status})")


def incidents(
    job: Annotated[str | None, typer.Option(help="only this job's")] = None,
    status: Annotated[Status | None, typer.Option(help="only in this status")] = None,
    node: Annotated[str | None, typer.Option(help="only those whose fault is on this node")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="at most this many")] = 100,
    cursor: Annotated[
        str | None, typer.Option(help="the page after the one that printed this cursor")
    ] = None,
    server: Server = DEFAULT_SERVER,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """Incidents, newest first, a page at a time (older ones: --cursor, printed on stderr)."""
    items, older = call(
        server, token, lambda c: c.incidents_page(job, status, limit, node=node, cursor=cursor)
    )
    show(items, as_json, render.incidents(items))
    if older is not None:
        typer.echo(f"older incidents: --cursor {older}", err=True)


def incident(
    incident_id: IncidentId,
    server: Server = DEFAULT_SERVER,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """One incident and its timeline."""
    inc = call(server, token, lambda c: c.incident(incident_id))
    show(inc, as_json, render.incident(inc))


def approve(
    incident_id: IncidentId,
    reason: Annotated[str, typer.Option(help="why (audited)")] = "approved by an operator",
    server: Server = DEFAULT_SERVER,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """Approve a dry-run recommendation: the engine carries it out."""
    inc = call(server, token, lambda c: c.approve(incident_id, reason))
    show(inc, as_json, f"incident {inc.id}: {inc.level} approved ({inc.status})")


def reject(
    incident_id: IncidentId,
    reason: Annotated[str, typer.Option(help="why (audited)")] = "rejected by an operator",
    server: Server = DEFAULT_SERVER,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """Reject a dry-run recommendation."""
    inc = call(server, token, lambda c: c.reject(incident_id, reason))
    show(inc, as_json, f"incident {inc.id}: {inc.level} rejected ({inc.status})")


def cordon(
    node: Annotated[str, typer.Argument(help="node name")],
    reason: Annotated[str, typer.Option(help="why (audited)")],
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="also when the node hosts live ranks: it leaves their jobs, which restart "
            "without it (an incident each)",
        ),
    ] = False,
    server: Server = DEFAULT_SERVER,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """Cordon a node: no new work on it (with live ranks on it, --force takes it out of
    their jobs)."""
    result = call(server, token, lambda c: c.cordon(node, reason, force))
    text = "cordoned" if result.changed else "was already cordoned; nothing to do"
    if result.incidents:
        text += f"; it leaves its jobs (incident {', '.join(map(str, result.incidents))})"
    show(result, as_json, f"node {result.name}: {text}")


def uncordon(
    node: Annotated[str, typer.Argument(help="node name")],
    reason: Annotated[str, typer.Option(help="why (audited)")],
    server: Server = DEFAULT_SERVER,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """Readmit a cordoned node (through the uncordon hook)."""
    result = call(server, token, lambda c: c.uncordon(node, reason))
    text = "readmitted (uncordoned)" if result.changed else "was not cordoned; nothing to do"
    show(result, as_json, f"node {result.name}: {text}")
