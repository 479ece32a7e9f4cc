"""Silent agents: when an agent's silence is evidence that its node is down, and when it
is only an agent gone (docs/engine.md, "Agent silence is not node death").

An agent silent for `down_after_s` (TRAINGUARD_NODE_DOWN_AFTER_S) while its node hosts
live ranks is judged, once the engine has itself listened that long, job by job:

- an agent that said goodbye (`going_away`: an upgrade, systemctl stop) is `agent_down`:
  never evidence, never an alert (the node's state says it);
- `progress`: a job hosted there trained on, as its ranks on other reporting nodes show,
  for at least half the threshold past the silent node's last reported step. Synchronous
  training cannot complete a step without every rank, so the node's ranks take part:
  the node is not down. An `agent_silent` event says so (an alert, no action);
- `stalled`: the job has ranks on other reporting nodes and they did not train on that
  long: `node_down`, evidence for the engine (exclude_node by default), as before;
- `unobserved`: no other reporting node hosts the job (a single-node job, or every node
  of it silent): nothing says the ranks stopped, so an `agent_silent` event only.

One job's progress clears the node (its ranks run); otherwise one stalled job is enough.
Progress is measured on the clock of the node that reports it (the end of its rank's
step numbered as the silent node's last one, to its latest step's end), so agents'
clock offsets do not enter it.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from trainguard.backend.cluster.schemas import BackendEventKind
from trainguard.backend.engine.decide import Decider
from trainguard.backend.engine.evidence import Evidence
from trainguard.backend.models import Event, Job, Node, Rank, Step

ALERT: BackendEventKind = "agent_silent"
# Ranks of other nodes looked at per job (each one is an indexed read of its steps).
PEERS = 8


def silent_nodes(
    d: Decider,
    session: Session,
    now: float,
    down_after_s: float,
    seen: set[tuple[int, float, str]],
    listening_since: float,
) -> None:
    """Silence counts only once this engine has itself listened for `down_after_s`: after
    a backend outage every node looks silent until its agent reconnects. Each silence (a
    node's `last_seen`) gives at most one alert and one `node_down`; a silence judged an
    alert is judged again at every sweep while it is young enough (its job may stop)."""
    if now - listening_since < down_after_s:
        return
    max_age = d.policy.model.incidents.max_evidence_age_s
    nodes = session.scalars(
        select(Node).where(
            Node.cordoned.is_(False),
            Node.going_away.is_(None),
            Node.last_seen < now - down_after_s,
            Node.last_seen >= now - down_after_s - max_age,
        )
    ).all()
    for node in nodes:
        if (node.id, node.last_seen, "node_down") in seen:
            continue
        jobs = _hosted_jobs(session, node, down_after_s)
        if not jobs:
            continue
        verdicts = {
            job: _judge(session, job, node, last_step, now, down_after_s)
            for job, last_step in jobs.items()
        }
        silent_s = round(now - node.last_seen, 3)
        if "progress" not in verdicts.values() and "stalled" in verdicts.values():
            seen.add((node.id, node.last_seen, "node_down"))
            d.handle(
                session,
                Evidence(
                    kind="node_down",
                    ts=node.last_seen,  # silent since then (backend clock)
                    received_at=now,
                    node_id=node.id,
                    node=node.name,
                    message=f"agent silent for {now - node.last_seen:.1f} s and its jobs' "
                    "steps stopped on the other nodes (node down)",
                    data={"silent_s": silent_s},
                ),
            )
            continue
        key = (node.id, node.last_seen, ALERT)
        if key in seen:
            continue
        seen.add(key)
        _alert(session, d, node, verdicts, now, silent_s)
    if len(seen) > 10000:
        seen.clear()


def _hosted_jobs(session: Session, node: Node, down_after_s: float) -> dict[Job, int | None]:
    """The jobs with live ranks on the node by its last report: {job: the highest step its
    ranks there reported}."""
    rows = session.execute(
        select(Job, func.max(Rank.last_step))
        .join(Rank, Rank.job_id == Job.id)
        .where(
            Rank.node_id == node.id,
            Rank.alive.is_(True),
            Rank.updated_at >= node.last_seen - down_after_s,
        )
        .group_by(Job.id)
        .order_by(Job.id)
    ).all()
    return {job: last for job, last in rows}


def _judge(
    session: Session, job: Job, node: Node, last_step: int | None, now: float, down_after_s: float
) -> str:
    """progress | stalled | unobserved (the module's docstring)."""
    peers = session.scalars(
        select(Rank.rank)
        .join(Node, Node.id == Rank.node_id)
        .where(
            Rank.job_id == job.id,
            Rank.node_id != node.id,
            Rank.alive.is_(True),
            Node.last_seen >= now - down_after_s,
        )
        .order_by(Rank.rank)
        .limit(PEERS)
    ).all()
    if not peers:
        return "unobserved"
    # A node whose ranks reported no step yet: the peers' whole generation counts.
    since_step = -1 if last_step is None else last_step
    for rank in peers:
        ends = session.execute(
            select(func.min(Step.end), func.max(Step.end)).where(
                Step.job_id == job.id,
                Step.rank == rank,
                Step.step >= since_step,
                # This generation's: an earlier one's steps past it say nothing of now.
                Step.attempt == job.attempt,
                Step.iteration == job.iteration,
            )
        ).one()
        if ends[0] is not None and ends[1] - ends[0] >= down_after_s / 2:
            return "progress"
    return "stalled"


def _alert(
    session: Session,
    d: Decider,
    node: Node,
    verdicts: dict[Job, str],
    now: float,
    silent_s: float,
) -> None:
    """An `agent_silent` event on the node (an alert: no incident, no action)."""
    trains = sorted(j.name for j, v in verdicts.items() if v == "progress")
    if trains:
        why = f"its ranks train on: job {', '.join(trains)} steps on other nodes"
    else:
        names = ", ".join(sorted(j.name for j in verdicts))
        why = f"nothing says its ranks stopped (no other node of job {names} reports)"
    job = trains[0] if trains else min(j.name for j in verdicts)
    session.add(
        Event(
            node_id=node.id,
            ts=now,
            received_at=now,
            kind=ALERT,
            job=job,
            message=f"agent silent on {node.name} for {silent_s:.0f} s; not node down: {why}",
            data={"silent_s": silent_s, "jobs": ",".join(sorted(j.name for j in verdicts))},
        )
    )
    d._count("agent_silent")
