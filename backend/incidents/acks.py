"""The agents' acks of the incidents' commands: each phase stored once
(`record_ack`, from the command channel's route), then moving its incident's timeline and
resolving or failing it (`record_phase`), or saying how a stop_job went (`record_stop`).
Command rows are made in incidents/service.py (`issue_commands`): the incidents package
is the one writer of commands and their acks."""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainguard.backend.errors import Conflict, NotFound
from trainguard.backend.incidents import reads, service
from trainguard.backend.incidents.publish import changed
from trainguard.backend.jobs.service import set_job_state
from trainguard.backend.models import TIMELINE, Command, CommandAck, Incident, Job, Node
from trainguard.protocol import wire


def record_ack(session: Session, command_id: str, ack: wire.Ack, now: float | None = None) -> bool:
    """Store one phase ack; returns False if this phase was already acked (replay).
    `now`: the backend's clock (a policy replay's virtual clock; the wall clock if None)."""
    cmd = session.get(Command, command_id)
    if cmd is None:
        raise NotFound(f"no command {command_id!r}")
    node = session.get(Node, cmd.node_id)
    if node is None or node.name != ack.node:
        raise Conflict(f"command {command_id!r} is not addressed to node {ack.node!r}")
    if session.get(CommandAck, (command_id, ack.phase)) is not None:
        return False
    now = time.time() if now is None else now
    session.add(
        CommandAck(
            command_id=command_id, phase=ack.phase, ts=ack.ts, received_at=now, detail=ack.detail
        )
    )
    if ack.phase == "delivered" and cmd.delivered_at is None:
        cmd.delivered_at = ack.ts
    record_phase(session, cmd, ack, now)
    session.flush()
    return True


# Which incident field each ack phase fills: the first delivery, the last of the others
# (a phase is complete when every node has done it).
_PHASE_FIELD = {
    "delivered": "delivered_at",
    "torn_down": "torn_down_at",
    "restarted": "restarted_at",
    "resumed": "resumed_at",
}


# A job given up on (stop_job), as its stop_job commands go (record_stop).
ENDING_LAUNCHER = "trainguard is ending its launcher"


STILL_RESTARTS = "trainguard stopped acting; the launcher still restarts it"


def record_phase(session: Session, cmd: Command, ack: wire.Ack, now: float | None = None) -> None:
    """A phase ack of one of the incident's commands (stored by `record_ack`) moves
    its timeline, and resolves or fails it (at `now`, the wall clock if None)."""
    now = time.time() if now is None else now
    if cmd.incident_id is None:
        return
    if cmd.action == "stop_job":
        record_stop(session, cmd, ack)
        return
    if cmd.action == "exclude_node":
        record_leave(session, cmd, ack)
        return
    inc = session.get(Incident, cmd.incident_id, with_for_update=True, populate_existing=True)
    if inc is None:
        return
    if inc.acted_at is not None and cmd.issued_at < inc.acted_at:
        return  # an ack of an action that an escalation superseded: kept, not counted
    if inc.status != "open":
        return  # resolved, given up, rejected or already failed: the timeline is closed
    if ack.phase == "failed":
        if reads.NOTHING_HERE in ack.detail and _others_carry_on(session, inc, cmd, now):
            return  # its workers there were gone; the action goes on on the other nodes
        service.fail(session, inc, now, f"failed on {ack.node}: {ack.detail}")
        return
    field = _PHASE_FIELD[ack.phase]
    if ack.phase != "delivered" and inc.decided_at is not None and ack.ts < inc.decided_at:
        # The job restarted by itself (NVRx's Wrapper, its launcher) before trainguard
        # decided: the command found the restart done. The timeline is the recovery's, so
        # the decision and the delivery, which did not bring it, leave it (they stay in
        # the decisions and the commands).
        inc.decided_at = inc.delivered_at = None
        if "restarted by itself" not in inc.outcome:
            inc.outcome = "the job restarted by itself before trainguard decided"
        changed(session, inc)
    elif ack.phase != "delivered" and inc.delivered_at is not None and ack.ts < inc.delivered_at:
        # Decided, and the launcher's own restart (ft_launcher, torchrun, with the warm
        # pool in under half a second) came before the command did: the command reports
        # the launcher's times (already restarted). The delivery did not bring the
        # restart, so it leaves the timeline (it stays on the command).
        inc.delivered_at = None
        changed(session, inc)
    current = getattr(inc, field)
    if (
        current is None
        or (ack.phase == "delivered" and ack.ts < current)
        or (ack.phase != "delivered" and ack.ts > current)
    ) and _fits(inc, field, ack.ts):
        setattr(inc, field, ack.ts)
        changed(session, inc)
    if ack.phase == "resumed":
        # Resolved once every node addressed by the current action has resumed (a node
        # whose workers were already gone, acked "no live rank", does not hold it up).
        session.flush()
        done = reads.terminal_acks(session, inc)
        if all(done.values()) and "resumed" in done.values():
            service.resolve(session, inc, now, _resumed(session, inc))


def record_leave(session: Session, cmd: Command, ack: wire.Ack) -> None:
    """An ack of the excluded node's leaving (engine.actions `_leave`): its exclusion
    decision says when and how the node left the job, or why it did not. It is no
    restart, so it neither resolves nor fails the incident (the restart of the job's other
    nodes does); a node that did not leave is said in the outcome."""
    if ack.phase not in ("torn_down", "failed"):
        return
    inc = session.get(Incident, cmd.incident_id, with_for_update=True, populate_existing=True)
    node = session.get(Node, cmd.node_id)
    if inc is None or node is None:
        return
    decisions = list(inc.decisions)
    for i in range(len(decisions) - 1, -1, -1):
        entry = decisions[i]
        if entry.get("level") == "exclude_node" and entry.get("node") == node.name:
            if ack.phase == "torn_down":
                left = {"left_at": ack.ts, "leave": f"{node.name} left: {ack.detail}"}
            else:
                left = {"leave": f"{node.name} did not leave: {ack.detail}"}
            decisions[i] = {**entry, **left}
            inc.decisions = decisions
            changed(session, inc)
            break
    if ack.phase == "failed" and inc.status == "open" and reads.NOTHING_HERE not in ack.detail:
        service.note(session, inc, f"{node.name} did not leave the job: {ack.detail}")


WITHOUT = "resumed without "
# How long after its resolution an exclusion's outcome may still learn its replacement.
REPLACEMENT_WINDOW_S = 120.0


def name_replacements(session: Session, now: float) -> None:
    """Exclusions resolved lately as "resumed without N" whose spare's rank_start events
    came in after the survivors' first step (another agent's batch): their outcome names
    the node that took N's place once those events are stored (engine sweep, each tick)."""
    rows = session.scalars(
        select(Incident).where(
            Incident.status == "resolved",
            Incident.level == "exclude_node",
            Incident.closed_at >= now - REPLACEMENT_WINDOW_S,
            Incident.outcome.startswith(WITHOUT),
        )
    ).all()
    for inc in rows:
        outcome = _resumed(session, inc)
        if outcome != inc.outcome:
            inc.outcome = outcome
            changed(session, inc)


def _nodes_of(session: Session, inc: Incident, action: str) -> set[str]:
    """The nodes the incident's commands of `action` went to."""
    stmt = (
        select(Node.name)
        .join(Command, Command.node_id == Node.id)
        .where(Command.incident_id == inc.id, Command.action == action)
    )
    return set(session.scalars(stmt).all())


def _resumed(session: Session, inc: Incident) -> str:
    """The outcome of a restart that resumed; after an exclusion, which node replaced the
    excluded one (a spare whose ranks now run the job), or that the job went on smaller."""
    if inc.level != "exclude_node" or inc.job_id is None:
        return "resumed"
    left = sorted(_nodes_of(session, inc, "exclude_node"))
    if not left:
        return "resumed"
    restarted = _nodes_of(session, inc, "launcher")
    job = session.get(Job, inc.job_id)
    since = inc.acted_at or 0.0
    joined = (
        sorted(reads.joined_since(session, job.name, since) - restarted - set(left)) if job else []
    )
    if joined:
        return f"resumed; {', '.join(joined)} took the place of {', '.join(left)}"
    return f"{WITHOUT}{', '.join(left)}"


def record_stop(session: Session, cmd: Command, ack: wire.Ack) -> None:
    """An ack of stop_job's command: once every node answered, the stopped job's state
    says whether its launcher ended (torn_down; a node where nothing of it ran any more
    needs nothing) or goes on restarting it somewhere (failed)."""
    if ack.phase not in ("torn_down", "failed"):
        return
    session.flush()
    job = session.get(Job, cmd.job_id, with_for_update=True, populate_existing=True)
    if job is None or job.state != "stopped":
        return
    ends = session.execute(
        select(Node.name, CommandAck.phase, CommandAck.detail)
        .select_from(Command)
        .join(Node, Node.id == Command.node_id)
        .outerjoin(
            CommandAck,
            (CommandAck.command_id == Command.id) & CommandAck.phase.in_(("torn_down", "failed")),
        )
        .where(Command.incident_id == cmd.incident_id, Command.action == "stop_job")
        .order_by(Node.name)
    ).all()
    if any(phase is None for _, phase, _ in ends):
        return  # still under way somewhere
    failed = [
        f"{node}: {detail}"
        for node, phase, detail in ends
        if phase == "failed" and reads.NOTHING_HERE not in detail
    ]
    ended = [node for node, phase, _ in ends if phase == "torn_down"]
    if failed:
        reason = f"{cmd.reason}; {STILL_RESTARTS} ({'; '.join(failed)})"
    elif ended:
        reason = f"{cmd.reason}; trainguard ended its launcher on {', '.join(ended)}"
    else:
        reason = f"{cmd.reason}; nothing of it runs any more"
    set_job_state(job, "stopped", ack.ts, reason)


def _others_carry_on(session: Session, inc: Incident, cmd: Command, now: float) -> bool:
    """Whether the current action's other commands are still under way or resumed (then
    a node whose workers were gone does not fail the incident)."""
    session.flush()
    done = reads.terminal_acks(session, inc)
    done.pop(cmd.id, None)
    if not done or "failed" in done.values():
        return False
    if "resumed" in done.values() and all(done.values()):
        service.resolve(session, inc, now, "resumed")
    return any(v in (None, "resumed") for v in done.values())


def _fits(inc: Incident, field: str, ts: float) -> bool:
    """Whether `ts` keeps the timeline in order (fault <= detected <= ... <= resumed)
    with the timestamps already present. One that does not (a late ack of a phase the
    timeline has passed) stays on its command, out of the incident's timeline."""
    i = TIMELINE.index(field)
    before = [getattr(inc, f) for f in TIMELINE[:i]]
    after = [getattr(inc, f) for f in TIMELINE[i + 1 :]]
    return all(t is None or t <= ts for t in before) and all(t is None or ts <= t for t in after)
