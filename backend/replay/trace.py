"""A period's recorded evidence as a file: export, import, redaction (docs/replay.md).

The file is JSON lines. The first line is the header (`format`, `version`, the period,
whether it was redacted); every other line is one record `{"t": kind, ...}`:

- the world the engine reads: `node`, `gpu`, `job`, `rank` (each rank's last stored row),
  `batch` (when a node's batch was received: its agent's heartbeat, `ingest_batches`),
  `event` (every event of the period and of a warm-up before it, in id order), `step`;
- what was decided, to compare with: `incident` (cause, node, level, status, decisions,
  hooks, timeline), `evidence` (which event each incident holds), `command`, `ack`,
  `cordon`.

Nodes and jobs are named, never numbered (ids are the database's own). A reader refuses a
file of a newer version by name; an older one is read as it was written.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from trainguard.backend.models import (
    Command,
    CommandAck,
    Event,
    Gpu,
    Incident,
    IngestBatch,
    Job,
    Node,
    NodeCordon,
    Rank,
    Step,
)
from trainguard.backend.models.control import IncidentEvidence
from trainguard.backend.replay import gpuspans

FORMAT = "trainguard-trace"
# 2: GPU readings as spans (`gpu_span`, gpuspans.py), the header's `exported_at`, a
# batch's `going_away`, an ack's `received_at`.
VERSION = 2
KINDS = (
    "node",
    "gpu",
    "gpu_span",
    "job",
    "rank",
    "batch",
    "event",
    "step",
    "incident",
    "evidence",
    "command",
    "ack",
    "cordon",
)
# Evidence before the period that the engine's windows look back on (repeated hard XIDs,
# the last checkpoint before a fault): kept as history, never decided on.
WARMUP_S = 3600.0


class TraceError(ValueError):
    """A trace that cannot be read or made; the message is one line."""


@dataclass
class Trace:
    since: float
    until: float
    job: str | None = None
    redacted: bool = False
    version: int = VERSION
    exported_at: float | None = None  # when the record was read (its decisions' state)
    records: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {k: [] for k in KINDS})

    def __getitem__(self, kind: str) -> list[dict[str, Any]]:
        return self.records[kind]

    def header(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "since": self.since,
            "until": self.until,
            "job": self.job,
            "redacted": self.redacted,
            "exported_at": self.exported_at,
            "counts": {k: len(v) for k, v in self.records.items()},
        }

    def decided_events(self) -> int:
        """The events of the period itself (the warm-up's are history)."""
        return sum(1 for e in self["event"] if e["received_at"] >= self.since)


# --- export ---------------------------------------------------------------------------


def export(
    session: Session, since: float, until: float, job: str | None = None, redact: bool = False
) -> Trace:
    """The period's recorded world and decisions, read from the live database (reads
    only)."""
    if until <= since:
        raise TraceError(f"empty period: from {since} is not before to {until}")
    tr = Trace(since=since, until=until, job=job, exported_at=time.time())
    job_rows = list(session.scalars(select(Job).order_by(Job.id)))
    if job is not None:
        job_rows = [j for j in job_rows if j.name == job]
        if not job_rows:
            raise TraceError(f"no job {job!r}")
    jobs = {j.id: j for j in job_rows}
    nodes = {n.id: n for n in session.scalars(select(Node).order_by(Node.id))}
    ranks = list(
        session.scalars(select(Rank).where(Rank.job_id.in_(jobs)).order_by(Rank.job_id, Rank.rank))
    )
    if job is not None:
        hosting = {r.node_id for r in ranks}
        nodes = {i: n for i, n in nodes.items() if i in hosting}
    for n in nodes.values():
        tr["node"].append(
            {
                "name": n.name,
                "simulated": n.simulated,
                "first_seen": n.first_seen,
                "clock_offset_s": n.clock_offset_s,
            }
        )
    gpus = list(session.scalars(select(Gpu).where(Gpu.node_id.in_(nodes)).order_by(Gpu.id)))
    for g in gpus:
        tr["gpu"].append({"node": nodes[g.node_id].name, "uuid": g.uuid, "index": g.index})
    named = {g.id: (nodes[g.node_id].name, g.uuid) for g in gpus}
    tr.records["gpu_span"] = gpuspans.export(session, named, since - gpuspans.LOOKBACK_S, until)
    for j in jobs.values():
        tr["job"].append(
            {
                "name": j.name,
                "first_seen": j.first_seen,
                "world_size": j.world_size,
                "display_name": j.display_name,
                "attempt": j.attempt,
                "iteration": j.iteration,
            }
        )
    for r in ranks:
        tr["rank"].append(
            {
                "job": jobs[r.job_id].name,
                "rank": r.rank,
                "node": nodes[r.node_id].name,
                "local_rank": r.local_rank,
                "pid": r.pid,
                "attempt": r.attempt,
                "iteration": r.iteration,
                "in_process": r.in_process,
                "launcher": r.launcher,
                "max_restarts": r.max_restarts,
                "restart_count": r.restart_count,
            }
        )
    for nid, at, away in session.execute(
        select(IngestBatch.node_id, IngestBatch.received_at, IngestBatch.going_away)
        .where(
            IngestBatch.node_id.in_(nodes),
            IngestBatch.received_at >= since - WARMUP_S,
            IngestBatch.received_at <= until,
        )
        .order_by(IngestBatch.received_at)
    ):
        tr["batch"].append({"node": nodes[nid].name, "received_at": at})
        if away is not None:  # an agent's goodbye before a graceful stop
            tr["batch"][-1]["going_away"] = away
    names = {j.name for j in jobs.values()}
    ev_q = select(Event).where(
        Event.received_at >= since - WARMUP_S,
        Event.received_at <= until,
        or_(Event.node_id.is_(None), Event.node_id.in_(nodes)),
    )
    if job is not None:
        ev_q = ev_q.where(or_(Event.job.is_(None), Event.job.in_(names)))
    for e in session.scalars(ev_q.order_by(Event.id)):
        tr["event"].append(
            {
                "id": e.id,
                "node": nodes[e.node_id].name if e.node_id in nodes else None,
                "ts": e.ts,
                "received_at": e.received_at,
                "kind": e.kind,
                "gpu_uuid": e.gpu_uuid,
                "job": e.job,
                "rank": e.rank,
                "xid": e.xid,
                "message": e.message,
                "data": e.data or {},
            }
        )
    for st in session.scalars(
        select(Step)
        .where(Step.job_id.in_(jobs), Step.end >= since - WARMUP_S, Step.end <= until)
        .order_by(Step.id)
    ):
        tr["step"].append(
            {
                "job": jobs[st.job_id].name,
                "node": nodes[st.node_id].name if st.node_id in nodes else None,
                "rank": st.rank,
                "step": st.step,
                "start": st.start,
                "end": st.end,
                "attempt": st.attempt,
                "iteration": st.iteration,
                "compute_s": st.compute_s,
            }
        )
    _export_decisions(session, tr, jobs, nodes)
    if redact:
        from trainguard.backend.replay.redact import redact_trace

        redact_trace(tr)
    return tr


def _export_decisions(
    session: Session, tr: Trace, jobs: dict[int, Job], nodes: dict[int, Node]
) -> None:
    def name(nid: int | None) -> str | None:
        return nodes[nid].name if nid in nodes else None

    incs = list(
        session.scalars(
            select(Incident)
            .where(
                Incident.job_id.in_(jobs),
                Incident.created_at >= tr.since,
                Incident.created_at <= tr.until,
            )
            .order_by(Incident.id)
        )
    )
    ids = [i.id for i in incs]
    for i in incs:
        tr["incident"].append(incident_row(i, jobs[i.job_id].name, name(i.node_id)))
    for ev in session.scalars(
        select(IncidentEvidence).where(IncidentEvidence.incident_id.in_(ids))
    ):
        tr["evidence"].append(
            {
                "incident": ev.incident_id,
                "event": ev.event_id,
                "kind": ev.kind,
                "node": name(ev.node_id),
                "ts": ev.ts,
                "received_at": ev.received_at,
            }
        )
    cmds = list(session.scalars(select(Command).where(Command.incident_id.in_(ids))))
    for c in cmds:
        tr["command"].append(
            {
                "id": c.id,
                "incident": c.incident_id,
                "node": name(c.node_id),
                "action": c.action,
                "issued_at": c.issued_at,
            }
        )
    for a in session.scalars(
        select(CommandAck).where(CommandAck.command_id.in_([c.id for c in cmds]))
    ):
        tr["ack"].append(
            {
                "command": a.command_id,
                "phase": a.phase,
                "ts": a.ts,
                "received_at": a.received_at,
                "detail": a.detail,
            }
        )
    for nc in session.scalars(
        select(NodeCordon)
        .where(
            NodeCordon.node_id.in_(nodes),
            NodeCordon.at <= tr.until,
            or_(NodeCordon.released_at.is_(None), NodeCordon.released_at >= tr.since - WARMUP_S),
        )
        .order_by(NodeCordon.at)
    ):
        tr["cordon"].append(
            {
                "node": name(nc.node_id),
                "at": nc.at,
                "by": nc.by,
                "incident": nc.incident_id,
                "released_at": nc.released_at,
            }
        )


# --- file --------------------------------------------------------------------------------


def write(tr: Trace, out: TextIO) -> None:
    out.write(json.dumps(tr.header(), sort_keys=True) + "\n")
    for kind in KINDS:
        for rec in tr[kind]:
            out.write(json.dumps({"t": kind, **rec}, sort_keys=True) + "\n")


def save(tr: Trace, path: Path) -> str:
    """Write the trace to `path`; returns its sha256."""
    with path.open("w") as f:
        write(tr, f)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read(lines: Iterable[str], source: str = "trace") -> Trace:
    it: Iterator[str] = iter(lines)
    first = next(it, "")
    try:
        head = json.loads(first)
    except json.JSONDecodeError:
        head = None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise TraceError(f"{source}: not a {FORMAT} file (its first line is not the header)")
    version = head.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise TraceError(
            f"{source}: {FORMAT} version {version} is newer than this trainguard reads "
            f"(version {VERSION}); replay it with a newer trainguard"
        )
    try:
        tr = Trace(
            since=float(head["since"]),
            until=float(head["until"]),
            job=head.get("job"),
            redacted=bool(head.get("redacted")),
            version=version,
            exported_at=head.get("exported_at"),
        )
    except (KeyError, TypeError, ValueError):
        raise TraceError(f"{source}: the header lacks since/until") from None
    for n, line in enumerate(it, 2):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            kind = rec.pop("t")
            tr[kind].append(rec)
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise TraceError(f"{source}: line {n} is not a record of this format") from None
    return tr


def load(path: Path) -> Trace:
    try:
        with path.open() as f:
            return read(f, str(path))
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None


def incident_row(i: Incident, job: str | None, node: str | None) -> dict[str, Any]:
    """An incident as a trace records it, and as a replay's run reports its own."""
    return {
        "id": i.id,
        "job": job,
        "trigger": i.trigger,
        "cause": i.cause,
        "level": i.level,
        "status": i.status,
        "outcome": i.outcome,
        "node": node,
        "created_at": i.created_at,
        "fault_at": i.fault_at,
        "decided_at": i.decided_at,
        "acted_at": i.acted_at,
        "resumed_at": i.resumed_at,
        "closed_at": i.closed_at,
        "escalations": i.escalations,
        "decisions": i.decisions or [],
        "hooks": i.hooks or [],
    }
