"""The rows `trainguard bench chaos` reads (backend/bench/chaos.py runs it): the database
of its server, read-only and with explicit columns (the schema grows under it), and the
processes of its job, from /proc."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainguard.backend.bench.chaos_checks import Command, Cordon, NodeEvent, Step


def proc_start(pid: int) -> str | None:
    """The process's start time in ticks (with its pid, an identity that survives reuse);
    None when it is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def workers(launcher_pid: int, seen: dict[int, str]) -> list[tuple[int, int, float]]:
    """(rank, pid, age in seconds) of a launcher's live training processes; every
    descendant goes into `seen` so that the bench can end whatever a launcher leaves
    behind."""
    from trainguard.backend import demojob

    uptime = float(Path("/proc/uptime").read_text().split()[0])
    tick = os.sysconf("SC_CLK_TCK")
    out = []
    for pid in demojob.descendants(launcher_pid):
        start = proc_start(pid)
        if start is None:
            continue
        seen.setdefault(pid, start)
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if demojob.TRAIN_SCRIPT.name.encode() not in cmd:
            continue
        rank = next((e[5:] for e in env if e.startswith(b"RANK=")), None)
        if rank is not None and rank.isdigit():
            out.append((int(rank), pid, round(uptime - int(start) / tick, 1)))
    return sorted(out)


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (e.decode(errors="replace").partition("=") for e in raw.split(b"\0") if e)
    return {k: v for k, _, v in pairs}


def proc_budget(launcher_pids: list[int], seen: dict[int, str]) -> dict[str, Any] | None:
    """The launchers' restart budget as their live workers were told it (torch's
    LocalElasticAgent sets TORCHELASTIC_MAX_RESTARTS and TORCHELASTIC_RESTART_COUNT in each
    worker's environment): the fewest restarts left of any worker, how many workers said
    so, and the youngest's age; None when no worker lives."""
    lefts, ages = [], []
    for launcher in launcher_pids:
        for _rank, pid, age in workers(launcher, seen):
            env = _environ(pid)
            most, used = env.get("TORCHELASTIC_MAX_RESTARTS"), env.get("TORCHELASTIC_RESTART_COUNT")
            if most is not None and used is not None and most.isdigit() and used.isdigit():
                lefts.append(int(most) - int(used))
                ages.append(age)
    if not lefts:
        return None
    return {"restarts_left": min(lefts), "workers": len(lefts), "youngest_s": min(ages)}


def read_cordons(conn: Any) -> list[Cordon]:
    """Node cordons from audit_log (action "cordon", target "node:<name>"), the record
    every cordon has today. When node_cordons lands, read it here instead (`at`, the node's
    name, `by` as the actor, `reason`): the checks take the same Cordon rows."""
    from sqlalchemy import select

    from trainguard.backend.models import AuditLog

    q = select(AuditLog.ts, AuditLog.target, AuditLog.actor, AuditLog.reason).where(
        AuditLog.action == "cordon", AuditLog.target.like("node:%")
    )
    return [
        Cordon(ts, target.removeprefix("node:"), actor, reason)
        for ts, target, actor, reason in conn.execute(q)
    ]


def read_database(conn: Any) -> dict[str, Any]:
    """The rows the report needs, read with explicit columns (the schema grows under it)."""
    from sqlalchemy import or_, select

    from trainguard.backend.models import Command as CommandRow
    from trainguard.backend.models import Event, Incident, Job, Node
    from trainguard.backend.models import Step as StepRow

    steps = conn.execute(
        select(Job.name, Node.name, StepRow.rank, StepRow.start, StepRow.end)
        .add_columns(StepRow.attempt, StepRow.iteration)
        .join(Job, Job.id == StepRow.job_id)
        .join(Node, Node.id == StepRow.node_id)
    )
    commands = conn.execute(
        select(CommandRow.id, Job.name, Node.name, CommandRow.action, CommandRow.issued_at)
        .add_columns(CommandRow.incident_id)
        .join(Job, Job.id == CommandRow.job_id)
        .join(Node, Node.id == CommandRow.node_id)
    )
    events = conn.execute(
        select(Event.ts, Node.name, Event.kind, Event.xid, Event.job)
        .join(Node, Node.id == Event.node_id)
        .where(or_(Event.kind.in_(("xid", "gpu_lost")), Event.job.is_not(None)))
    )
    return {
        "steps": [Step(*r) for r in steps],
        "commands": [Command(*r) for r in commands],
        "node_events": [NodeEvent(*r) for r in events],
        "cordons": read_cordons(conn),
        "incident_ids": list(conn.execute(select(Incident.id).order_by(Incident.id)).scalars()),
    }


def incidents_from_database(engine: Any, ids: list[int]) -> list[dict[str, Any]]:
    """The incidents as GET /api/v1/incidents/{id} gives them, read by the API's own
    function (for when the server is gone)."""
    from sqlalchemy.orm import Session

    from trainguard.backend.incidents.reads import incident_dict
    from trainguard.backend.models import Incident

    with Session(engine) as session:
        found = (session.get(Incident, i) for i in ids)
        return [incident_dict(session, inc) for inc in found if inc is not None]
