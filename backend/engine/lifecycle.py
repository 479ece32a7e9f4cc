"""The engine's sweep over lifecycles: jobs (running, restarting, waiting, finished,
failed, stopped) and cordoned nodes (readmission).

- A job is `restarting` while an action on it is under way, `waiting` while an exclusion
  left it no schedulable node, `finished` once every rank it had exited 0 and no new
  generation followed within `END_GRACE_S`, `failed` when its ranks are gone, not all
  cleanly, and no generation followed within `escalation.relaunch_wait_s` (the launcher
  gave up), `stopped` after stop_job (ended when its ranks are, through the launcher the
  agents ended; a job whose launcher could not be ended trains on, and ends finished or
  failed like any job) and `stopped` "ended by a signal from outside" when every rank
  ended by a stop signal its launcher got and passed on (evidence.stopped). A job seen
  again after its end runs again. The whole machine: docs/engine.md, "Jobs: state".
- A waiting job restarts (launcher) once a node hosting its ranks is readmitted; a job
  that ended cleanly while it waited closes its incident instead (nothing to restart).
- A `node_down` incident not acted on yet closes when the node's agent reports again.
- A job that ended (finished, failed) closes its incidents no action was taken on (held
  for an operator, in a cooldown) with that outcome, failed when the job failed: a
  launcher that gave up leaves nothing to restart. Held exclusions stay, about the node
  only (NODE_ONLY: approving cordons it and restarts nothing).
- A node cordoned by the engine is readmitted (policy `[readmission]`) once its agent has
  reported for `readmit_after_s` with every GPU present and no hard XID, and the health
  check hook (if any) exits 0; a node flagged for repair waits for an operator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from trainguard.backend.cluster import cordons
from trainguard.backend.engine import queries as q
from trainguard.backend.engine.actions import ENGINE_ACTOR, WAITING, HookJob, set_job_state
from trainguard.backend.engine.decide import Decider
from trainguard.backend.engine.evidence import clean_exit, stopped
from trainguard.backend.incidents import reads
from trainguard.backend.incidents import service as incidents
from trainguard.backend.models import (
    JOB_ENDED,
    Event,
    Gpu,
    Incident,
    Job,
    Node,
    NodeCordon,
    Rank,
    Sample,
    in_sample_window,
)
from trainguard.backend.models.control import ACTIVE_STATUSES

# Every rank exited 0 and nothing came back for this long: the job finished.
END_GRACE_S = 5.0
# The reason of a job its user stopped (its launcher got SIGTERM or SIGINT and exited).
OUTSIDE_STOP = "ended by a signal from outside (SIGTERM or SIGINT to its launcher)"

# Jobs and cordons looked at by the sweep: seen within this long.
LOOKBACK_S = 3600.0


def job_states(d: Decider, session: Session, now: float) -> None:
    jobs = session.scalars(
        select(Job).where(
            Job.last_seen >= now - LOOKBACK_S,
            or_(
                Job.state.not_in(JOB_ENDED),
                Job.last_seen > Job.ended_at + END_GRACE_S,
            ),
        )
    ).all()
    wait = d.policy.model.escalation.relaunch_wait_s
    for job in jobs:
        active = session.scalars(
            select(Incident)
            .where(Incident.job_id == job.id, Incident.status.in_(ACTIVE_STATUSES))
            .order_by(Incident.id.desc())
        ).all()
        if any(i.outcome.startswith(WAITING) for i in active):
            continue  # waiting_jobs' business
        # The incident that says most: an action under way, else the newest.
        inc = next((i for i in active if _under_way(i)), active[0] if active else None)
        end = _ends(session, job)
        if end is None:
            if job.state == "stopped" and job.ended_at is None and not _under_way(inc):
                continue  # given up on while it trains: stays so until it ends or is acted on
            state = "restarting" if _under_way(inc) else "running"
            _set(d, job, state, now, "")
            continue
        clean, stop, last = end.clean, end.stop, end.last
        if (clean or stop) and now - last >= END_GRACE_S and not _under_way(inc):
            # (An exclusion held for an operator stays pending: it is about the node.)
            if clean:
                state, why = "finished", "every rank exited 0" + end.unseen_note()
            elif "trainguard" in end.how and job.state == "stopped":
                state, why = "stopped", job.state_reason  # stop_job's, with its acks
            else:
                state, why = "stopped", OUTSIDE_STOP + end.unseen_note()
            _set(d, job, state, now, why, end.ended)
            _close_unacted(session, active, now, state, why)
        elif not clean and now - last >= max(wait, END_GRACE_S) and not _under_way(inc):
            if end.seen:
                why = "its ranks are gone and its launcher gave up" + end.unseen_note()
            else:
                why = "its ranks ended while their agents could not see them: how is unknown"
            _set(d, job, "failed", now, why, end.ended)
            _close_unacted(session, active, now, "failed", why)
        elif _under_way(inc):
            _set(d, job, "restarting", now, "")


def _close_unacted(
    session: Session, active: Sequence[Incident], now: float, state: str, why: str
) -> None:
    """The job ended (`state`, `why`): its incidents that no action was taken on (held
    for an operator, in a cooldown) have nothing left to restart and close with that
    outcome, failed when the job failed. An exclusion held for an operator stays pending,
    as a question about the node only (NODE_ONLY): approving it cordons the node and
    restarts nothing (actions.issue)."""
    outcome = f"the job {state} ({why}) before this was acted on: nothing is left to restart"
    for inc in active:
        if inc.acted_at is not None:
            continue
        if inc.level == "exclude_node":
            if inc.status == "pending" and not node_only(inc):
                _ask_about_the_node(session, inc, now, state)
            continue
        if state == "failed":
            incidents.fail(session, inc, now, outcome, end_wait=True)
        else:
            incidents.resolve(session, inc, now, outcome)


def _ask_about_the_node(session: Session, inc: Incident, now: float, state: str) -> None:
    """A held exclusion whose job ended (`state`) becomes a question about its node only."""
    culprit = q.culprit_node(session, inc)
    row = session.get(Node, culprit) if culprit is not None else None
    node = row.name if row is not None else "the node"
    incidents.hold(
        session,
        inc,
        now,
        f"{inc.outcome}; the job {state} meanwhile: approving now cordons {node} only, "
        "nothing is restarted",
        {
            "at": now,
            "level": "exclude_node",
            "by": ENGINE_ACTOR,
            "mode": NODE_ONLY,
            "node": node,
            "why": f"the job {state}",
            "restart": False,
        },
    )


# The decision mode of a held exclusion whose job ended: a question about the node only.
NODE_ONLY = "node_only"


def node_only(inc: Incident) -> bool:
    """A held exclusion whose job ended: approving it cordons the node, nothing more."""
    return bool(inc.decisions) and inc.decisions[-1].get("mode") == NODE_ONLY


def _under_way(inc: Incident | None) -> bool:
    return inc is not None and inc.status == "open" and inc.acted_at is not None


def _set(
    d: Decider, job: Job, state: str, now: float, reason: str, ended: float | None = None
) -> None:
    """The job's state, and when it ended if it did (jobs.service.set_job_state)."""
    if job.state != state:
        d._count(f"job_{state}")
    set_job_state(job, state, now, reason, ended)


def _last_exits(session: Session, job: str, since: float) -> dict[int, tuple[float, dict]]:
    """Each rank's last rank_exit event: {rank: (ts, data)}."""
    out: dict[int, tuple[float, dict]] = {}
    for rank, ts, data in session.execute(
        select(Event.rank, Event.ts, Event.data)
        .where(Event.kind == "rank_exit", Event.job == job, Event.ts >= since)
        .order_by(Event.ts)
    ):
        if rank is not None:
            out[rank] = (ts, dict(data or {}))
    return out


def waiting_jobs(d: Decider, session: Session, now: float) -> None:
    """A job left without a schedulable node restarts once one of its nodes is back."""
    rows = reads.locked_with_jobs(
        session, Incident.status == "open", Incident.outcome.startswith(WAITING)
    )
    for inc, job in rows:
        if _ended_cleanly(session, job):
            # Its ranks trained on (on the cordoned node: cordon means no new work) and
            # finished: nothing to restart, job_states says `finished`.
            incidents.resolve(
                session,
                inc,
                now,
                "the job ended while it waited for capacity (every rank exited 0): "
                "nothing to restart",
            )
            d._count("waits_ended_by_the_job")
            continue
        targets = q.job_nodes(session, job.id, now - d.fresh_within_s)
        free = [
            nid for nid in targets if (n := session.get(Node, nid)) is not None and not n.cordoned
        ]
        if not free:
            continue
        incidents.note(session, inc, "capacity is back: launcher restart")
        set_job_state(job, "restarting", now)
        d.issue(session, inc, job, "launcher", frozenset())


def _ended_cleanly(session: Session, job: Job) -> bool:
    """No rank of the job is alive and every one's last exit was clean (exit code 0)."""
    end = _ends(session, job)
    return end is not None and end.clean


@dataclass
class Ends:
    """How a job's ranks ended, once none is alive (_ends)."""

    seen: dict[int, tuple[float, dict[str, Any]]]  # rank -> its process's rank_exit (ts, data)
    unseen: dict[int, float]  # rank -> last listed alive, for ranks whose exit nobody saw
    clean: bool  # every exit seen was clean (at least one seen)
    stop: bool  # not clean, and every exit seen was clean or a stop (at least one stop)
    how: set[str | None]  # evidence.stopped of each exit seen
    last: float  # the newest exit seen (else the newest report): when the job ended

    @property
    def ended(self) -> float:
        return max([self.last, *self.unseen.values()])

    def unseen_note(self) -> str:
        if not self.unseen:
            return ""
        ranks = ", ".join(str(r) for r in sorted(self.unseen))
        return f"; rank {ranks}: exit unseen (their agent was away), read as the other ranks'"


def _ends(session: Session, job: Job) -> Ends | None:
    """How the job's ranks ended, or None while one is alive (or none is known).

    A rank's exit is its process's last rank_exit (one that names another pid is an
    earlier generation's). A rank with none ended unseen: its agent was down, or restarted
    and no longer listed it (ingest's unlisted ranks). Unseen exits are read as the seen
    ones: in a job whose other ranks all exited 0 it finished, where they were all
    stopped it was stopped; a job with no exit seen at all ends failed, how unknown."""
    ranks = session.execute(
        select(Rank.rank, Rank.alive, Rank.updated_at, Rank.pid).where(Rank.job_id == job.id)
    ).all()
    if not ranks or any(alive for _, alive, _, _ in ranks):
        return None
    reported = max(t for _, _, t, _ in ranks)
    exits = _last_exits(session, job.name, reported - LOOKBACK_S)
    seen = {
        r: exits[r]
        for r, _, _, pid in ranks
        if r in exits and exits[r][1].get("pid") in (None, pid)
    }
    unseen = {r: t for r, _, t, _ in ranks if r not in seen}
    datas = [data for _, data in seen.values()]
    clean = bool(datas) and all(clean_exit(d) for d in datas)
    stop = not clean and bool(datas) and all(clean_exit(d) or stopped(d) for d in datas)
    return Ends(
        seen=seen,
        unseen=unseen,
        clean=clean,
        stop=stop,
        how={stopped(d) for d in datas},
        last=max((ts for ts, _ in seen.values()), default=reported),
    )


def agents_back(d: Decider, session: Session, now: float) -> None:
    """A `node_down` incident not acted on yet (waiting for its cooldown, an operator's
    approval or the cordon breaker) whose node's agent reported again: its cause went
    away (the node was not down), so it closes with that outcome and nothing is done."""
    rows = reads.locked(
        session,
        Incident.status.in_(ACTIVE_STATUSES),
        Incident.cause == "node_down",
        Incident.acted_at.is_(None),
        Incident.created_at >= now - LOOKBACK_S,
    )
    for inc in rows:
        node = session.get(Node, inc.node_id) if inc.node_id is not None else None
        if node is None or inc.fault_at is None or node.last_seen <= inc.fault_at:
            continue
        if node.last_seen < now - d.fresh_within_s:
            continue  # not back yet (a late batch of the old silence)
        incidents.resolve(
            session,
            inc,
            now,
            f"the agent on {node.name} reported again: the node was not down; nothing done",
        )
        d._count("node_down_agent_back")


def readmissions(d: Decider, session: Session, now: float, running: set[tuple[int, float]]) -> None:
    policy = d.policy.model.readmission
    if not policy.auto:
        return
    rows = session.scalars(
        select(NodeCordon).where(
            NodeCordon.released_at.is_(None),
            NodeCordon.by == ENGINE_ACTOR,
            NodeCordon.at <= now - policy.readmit_after_s,
        )
    ).all()
    for row in rows:
        node = session.get(Node, row.node_id)
        if node is None or not node.cordoned or (-node.id, row.at) in running:
            continue
        recent = cordons.counts_since(session, now - policy.repair_window_s, [node.id])
        if recent.get(node.id, 0) >= policy.repair_after:
            continue  # flagged for repair: an operator readmits it
        if not _healthy(d, session, node, now, policy.readmit_after_s):
            continue
        if policy.health_check:
            values = {"node": node.name, "incident": row.incident_id or ""}
            d.hooks_due.append(
                HookJob(
                    0, row.at, "health_check", policy.health_check, values, frozenset(), node.id
                )
            )
            continue
        d.readmit_node(session, node, f"healthy for {policy.readmit_after_s:g} s")


def _healthy(d: Decider, session: Session, node: Node, now: float, for_s: float) -> bool:
    """The agent reports, every GPU of the node reports readings (none lost) over the
    last `for_s`, and no hard XID or lost GPU came from it in that time."""
    if node.last_seen < now - d.fresh_within_s:
        return False
    if q.hard_xids_on_node(session, node.id, now - for_s, now + 60) > 0:
        return False
    gpus = session.scalars(select(Gpu.id).where(Gpu.node_id == node.id)).all()
    if not gpus:
        return True
    since = now - min(for_s, 600.0)
    # Samples are stamped by the agent's clock: ten minutes past the server's still count.
    until = now + 600.0
    lost = session.scalar(
        select(func.count())
        .select_from(Sample)
        .where(
            Sample.gpu_id.in_(gpus),
            in_sample_window(since, until),
            Sample.util.is_(None),
            Sample.temp_c.is_(None),
            Sample.power_w.is_(None),
        )
    )
    if lost:
        return False
    fresh = session.execute(
        select(Sample.gpu_id)
        .where(Sample.gpu_id.in_(gpus), in_sample_window(now - d.fresh_within_s, until))
        .group_by(Sample.gpu_id)
    ).all()
    return len(fresh) == len(gpus)
