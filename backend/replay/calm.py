"""When the replay may skip the engine's sweeps (docs/replay.md, "The virtual clock").

The live engine sweeps every `sweep_s` because it cannot know when something changes;
the replay knows when its inputs come (evidence wakes a cycle; batches and steps are
stored between cycles). A sweep can still act on the clock alone: a cooldown ends, a
grace passes, an agent falls silent, a cordon is old enough for readmission. The
cluster is **calm** when none of those can happen before a deadline read from the
database, and only then the next sweep waits for that deadline (or the next evidence):

- no incident open (each has deadlines of its own: cooldowns, grace periods, relaunch
  waits), none pending on its job's budget (resolved by steps), none about a silent node
  still active, no automatic failure of the last hour (it may climb, or resolve on
  steps), no exclusion whose replacement may still be named;
- no ack due, no hook result waiting;
- no job whose ranks are all gone that `lifecycle.job_states` has not settled yet
  (ended within `escalation.relaunch_wait_s` and END_GRACE_S);
- no node silent past `fresh_within_s` (its silence is judged at every sweep), and the
  deadline is the first one's silence;
- no engine cordon old enough for readmission (it is checked at every sweep), and the
  deadline is the first one's `readmit_after_s`.

Anything else a calm sweep could do would wait at most MAX_CALM_S.
"""

from __future__ import annotations

from sqlalchemy import exists, func, or_, select
from sqlalchemy.orm import Session

from trainguard.backend.engine.actions import ENGINE_ACTOR
from trainguard.backend.engine.lifecycle import END_GRACE_S
from trainguard.backend.engine.lifecycle import LOOKBACK_S as JOB_LOOKBACK_S
from trainguard.backend.engine.policy import Policy
from trainguard.backend.engine.sweep import LOOKBACK_S
from trainguard.backend.incidents.acks import REPLACEMENT_WINDOW_S
from trainguard.backend.models import JOB_ENDED, Incident, Job, Node, NodeCordon, Rank

MAX_CALM_S = 60.0


def calm_until(s: Session, now: float, policy: Policy, fresh_within_s: float) -> float | None:
    """The instant up to which no sweep can change anything, or None when the next
    sweep may (then the replay sweeps every `sweep_s`, as the live engine does)."""
    model = policy.model
    busy = or_(
        Incident.status == "open",
        (Incident.status == "pending") & (Incident.cause == "node_down"),
        (Incident.status == "pending") & (Incident.level != "exclude_node"),
        (Incident.status == "failed")
        & (Incident.trigger == "auto")
        & (Incident.closed_at >= now - LOOKBACK_S),
        (Incident.status == "resolved")
        & (Incident.level == "exclude_node")
        & (Incident.closed_at >= now - REPLACEMENT_WINDOW_S),
    )
    if s.scalar(select(exists().where(busy))):
        return None
    alive = exists().where(Rank.job_id == Job.id, Rank.alive.is_(True))
    settle = max(model.escalation.relaunch_wait_s, END_GRACE_S) + 5.0
    unsettled = s.scalar(
        select(
            exists().where(
                Job.last_seen >= now - min(settle, JOB_LOOKBACK_S),
                Job.state.not_in(JOB_ENDED),
                ~alive,
            )
        )
    )
    if unsettled:
        return None
    until = now + MAX_CALM_S
    hosting = exists().where(Rank.node_id == Node.id, Rank.alive.is_(True))
    first = s.scalar(
        select(func.min(Node.last_seen)).where(
            Node.cordoned.is_(False), Node.going_away.is_(None), hosting
        )
    )
    if first is not None:
        if first + fresh_within_s <= now:
            return None
        until = min(until, first + fresh_within_s)
    if model.readmission.auto:
        oldest = s.scalar(
            select(func.min(NodeCordon.at)).where(
                NodeCordon.released_at.is_(None), NodeCordon.by == ENGINE_ACTOR
            )
        )
        if oldest is not None:
            if oldest + model.readmission.readmit_after_s <= now:
                return None
            until = min(until, oldest + model.readmission.readmit_after_s)
    return until
