"""The engine's periodic sweep (every `engine_sweep_s`, at most 1 s): what no event
announces.

- silent nodes: backend/engine/silence.py;
- incidents whose cooldown ended, or that an operator approved, are acted on;
- incidents whose action failed (a command acked `failed`) climb one level, except
  "no live rank" on a healthy node: that waits for the launcher's new generation first;
- incidents whose `resumed` ack is missing are resolved by the first completed step of
  the new generation;
- restarts whose commands stopped short of an end while the job's ranks are all gone
  fail after `escalation.relaunch_wait_s`;
- hooks whose result was lost (the leader changed while one ran) are carried on.
"""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from trainguard.backend.analytics import repository as steps
from trainguard.backend.engine import queries as q
from trainguard.backend.engine.actions import ENGINE_ACTOR, NO_RANK, HookJob
from trainguard.backend.engine.decide import Decider
from trainguard.backend.engine.evidence import JOB_CAUSES
from trainguard.backend.engine.policy import next_level
from trainguard.backend.hooks import HookResult
from trainguard.backend.incidents import reads
from trainguard.backend.incidents import service as incidents
from trainguard.backend.incidents.reads import NOTHING_HERE
from trainguard.backend.models import Incident, Job, Node

# A step-derived resumption waits this long for the agents' own `resumed` ack.
RESUME_GRACE_S = 2.0
# ... and, once a node acked `resumed`, this long for the others' acks.
PARTIAL_GRACE_S = 10.0
# The sweep looks at incidents acted on (or failed) this recently; older ones are left as
# they are (an operator sees them open or failed), so each sweep stays small.
LOOKBACK_S = 3600.0
# A restart whose commands stopped short of an end fails after this long with no ack
# (unfinished_actions): the agent's own wait for new workers (180 s, `restarted_timeout_s`,
# after which it acks failed) and a minute for its ack to come.
UNFINISHED_S = 240.0


def self_recovered(d: Decider, session: Session, now: float) -> None:
    """Incidents still waiting for their cooldown, or held for the launcher's last
    restart, whose job restarted by itself (NVRx's Wrapper, its launcher) and made a
    step: resolved, nothing is sent."""
    rows = reads.locked(
        session,
        Incident.status.in_(("open", "pending")),
        Incident.acted_at.is_(None),
        Incident.cause.in_(JOB_CAUSES),
        Incident.created_at >= now - LOOKBACK_S,
    )
    for inc in rows:
        if inc.status == "pending" and not budget_held(inc):
            continue  # a dry-run recommendation, or the breaker's: an operator answers it
        d.recovered_itself(session, inc)


def budget_held(inc: Incident) -> bool:
    """Held by the engine for the launcher's last restart (decide.Decider._budget_held)."""
    return bool(inc.decisions) and inc.decisions[-1].get("mode") == "budget"


def due_incidents(d: Decider, session: Session, now: float) -> None:
    """Open incidents not acted on yet whose time has come: cooldown over, or approved."""
    rows = reads.locked_with_jobs(
        session,
        Incident.status == "open",
        Incident.acted_at.is_(None),
        Incident.not_before.is_not(None),
        Incident.not_before <= now,
    )
    for inc, job in rows:
        last = inc.decisions[-1] if inc.decisions else None
        if last is not None and last.get("mode") == "approval":
            d.act(session, inc, job, inc.level, last.get("why", ""), last["by"], "approved")
        else:
            d.decide(session, inc, job, inc.level, f"{inc.cause} (after the cooldown)", True)


def failed_incidents(d: Decider, session: Session, now: float) -> None:
    """An automatic action that failed climbs one level (escalation.on_failed), unless
    the failure only says that the job's workers on a healthy node were already gone
    (`_wait_for_relaunch`)."""
    if not d.policy.model.escalation.on_failed:
        return
    rows = reads.locked_with_jobs(
        session,
        Incident.status == "failed",
        Incident.trigger == "auto",
        Incident.closed_at >= now - LOOKBACK_S,
    )
    for inc, job in rows:
        failed = q.failed_acks(session, inc)
        if not failed or inc.level == "stop_job":
            continue
        if _resumed_anyway(d, session, inc, now):
            continue
        if not _wait_for_relaunch(d, session, inc, failed, now):
            _climb(d, session, inc, job, failed[0], "")


def relaunch_waits(d: Decider, session: Session, now: float) -> None:
    """Incidents that waited for the launcher's new generation and saw no step of it in
    time climb one level, as their failure would have at once."""
    rows = reads.locked(
        session,
        Incident.status == "open",
        Incident.trigger == "auto",
        Incident.acted_at.is_not(None),
        Incident.acted_at >= now - LOOKBACK_S,
        Incident.resumed_at.is_(None),
        Incident.not_before.is_not(None),
        Incident.not_before <= now,
    )
    for inc in rows:
        failed = q.failed_acks(session, inc)
        job = session.get(Job, inc.job_id)
        wait = d.policy.model.escalation.relaunch_wait_s
        if job is not None and not failed and inc.outcome.startswith(NO_RANK):
            # Nothing to restart and no new generation came: the job is gone.
            incidents.fail(
                session,
                inc,
                now,
                f"no rank of the job came back within {wait:g} s: its launcher gave up or "
                "the job was ended",
                end_wait=True,
            )
            continue
        if not failed or job is None or inc.level == "stop_job":
            incidents.wait(session, inc, None)
            continue
        _climb(d, session, inc, job, failed[0], f"; no step of a new generation within {wait:g} s")


def unfinished_actions(d: Decider, session: Session, now: float) -> None:
    """A restart under way whose commands stopped short of an end (their last ack
    `torn_down` or `restarted`, nothing `failed` or `resumed`: the agent that carried it
    out was restarted meanwhile and forgot it) while no rank of the job is alive: after
    UNFINISHED_S (or `escalation.relaunch_wait_s` if longer) with no ack and no step, it
    failed. Nothing climbs from there (no node said why); the job then ends as its ranks
    did (lifecycle.job_states)."""
    wait = max(d.policy.model.escalation.relaunch_wait_s, UNFINISHED_S)
    rows = reads.locked(
        session,
        Incident.status == "open",
        Incident.acted_at.is_not(None),
        Incident.acted_at >= now - LOOKBACK_S,
        Incident.acted_at <= now - wait,
        Incident.resumed_at.is_(None),
        Incident.level.in_(("in_process", "launcher")),
        Incident.job_id.is_not(None),
    )
    for inc in rows:
        if inc.not_before is not None and inc.not_before > now:
            continue  # waiting for the launcher (relaunch_waits' business)
        last = q.last_ack(session, inc)
        if last is None or last[1] not in ("torn_down", "restarted") or last[2] > now - wait:
            continue  # not delivered (an agent away: node_down's), or still moving
        assert inc.job_id is not None
        if q.any_rank_alive(session, inc.job_id) or steps.first_step_after(session, inc):
            continue
        node, phase, ts = last
        incidents.fail(
            session,
            inc,
            now,
            f"the {inc.level} action stopped at {phase} on {node} {now - ts:.0f} s ago and "
            f"no rank of the job came back (the job's launcher gave up, or its agent "
            f"restarted and forgot the command)",
            end_wait=True,
        )
        d._count("unfinished_actions")


def _resumed_anyway(d: Decider, session: Session, inc: Incident, now: float) -> bool:
    """A command acked failed while the job did resume after the action (its launcher or
    NVRx restarted it): the restart worked, the incident is resolved."""
    first = steps.first_step_after(session, inc)
    if first is None:
        return False
    incidents.resolve(
        session,
        inc,
        now,
        f"resumed (the job's steps) although a command said: {inc.outcome}",
        resumed_at=first.end,
        resumed_step=first.step,
    )
    d._count("resumed_despite_failed_ack")
    return True


def _wait_for_relaunch(
    d: Decider, session: Session, inc: Incident, failed: list[tuple[int, str]], now: float
) -> bool:
    """A command that found no live rank on a node whose agent is healthy says that the
    job's workers there are gone, not that the node or the restart is bad: after a rank
    death the job's launcher (ft_launcher) stops its worker group and starts a new one by
    itself. Climbing on that (to exclude_node, then stop_job) would cordon a healthy node
    and give up a job that is recovering. So the incident is reopened and waits up to
    `escalation.relaunch_wait_s` (in `not_before`) for a step of the job's new generation
    (`resumed_from_steps` resolves it); `relaunch_waits` climbs when none comes. Once per
    action: a failure after the wait climbs."""
    wait = d.policy.model.escalation.relaunch_wait_s
    if wait <= 0 or (inc.not_before is not None and inc.not_before <= now):
        return False
    if not all(NOTHING_HERE in detail for _, detail in failed):
        return False  # some restart really failed
    for node_id, _ in failed:
        node = session.get(Node, node_id)
        if node is None or node.cordoned or node.last_seen < now - d.fresh_within_s:
            return False  # a silent node is node_down's business
    names = sorted({n.name for n in (session.get(Node, nid) for nid, _ in failed) if n})
    incidents.wait_for_relaunch(
        session,
        inc,
        now + wait,
        f"waiting up to {wait:g} s for the job's launcher to restart its workers "
        f"({', '.join(names)}: {failed[0][1]})",
    )
    d._count("relaunch_waits")
    return True


def _climb(
    d: Decider, session: Session, inc: Incident, job: Job, failure: tuple[int, str], more: str
) -> None:
    node_id, detail = failure
    node = session.get(Node, node_id)
    name = node.name if node is not None else "?"
    incidents.escalate(session, inc)
    up = next_level(inc.level, hardware=bool(q.hardware_nodes(session, inc)))
    why = f"the {inc.level} action failed on {name}: {detail}{more}"
    level, notes = d.plan(session, inc, job, up, d.clock())
    d.act(session, inc, job, level, "; ".join([why, *notes]), ENGINE_ACTOR, "auto")


def resumed_from_steps(d: Decider, session: Session, now: float) -> None:
    """Open incidents whose job resumed after the action although not every node acked
    `resumed` (an agent that restarted meanwhile forgot the command, or none acked):
    resolved from the job's steps, RESUME_GRACE_S after the step (PARTIAL_GRACE_S after
    the first node's `resumed` ack, which the others normally follow within a second)."""
    rows = reads.locked(
        session,
        Incident.status == "open",
        Incident.acted_at.is_not(None),
        Incident.acted_at <= now - RESUME_GRACE_S,
        Incident.acted_at >= now - LOOKBACK_S,
        or_(Incident.resumed_at.is_(None), Incident.resumed_at <= now - PARTIAL_GRACE_S),
    )
    for inc in rows:
        first = steps.first_step_after(session, inc)
        if first is None or first.end > now - RESUME_GRACE_S:
            continue
        acked = inc.resumed_at is not None
        # (A wait for the launcher's new generation ends here.)
        incidents.resolve(
            session,
            inc,
            now,
            "resumed (some nodes never acked resumed; the job's steps say it did)"
            if acked
            else "resumed (from the job's steps; no resumed ack)",
            resumed_at=None if acked else first.end,
            resumed_step=first.step,
        )
        d._count("resumed_from_steps")


def orphaned_hooks(
    d: Decider, session: Session, now: float, running: set[tuple[int, float]]
) -> None:
    """A hook that was due under a previous leader never reported: carry on without it."""
    timeout = d.policy.model.hooks.timeout_s
    rows = session.scalars(
        select(Incident).where(
            Incident.status == "open",
            Incident.acted_at.is_not(None),
            Incident.acted_at < now - timeout - 10,
            Incident.acted_at >= now - timeout - 10 - LOOKBACK_S,
        )
    ).all()
    for inc in rows:
        last = inc.decisions[-1] if inc.decisions else {}
        hook = last.get("hook")
        if not hook or (inc.id, inc.acted_at) in running or q.current_commands(session, inc):
            continue
        assert inc.acted_at is not None
        lost = HookResult(
            hook,
            [],
            False,
            None,
            "result lost: the engine's leader changed while it ran",
            inc.acted_at,
            0.0,
        )
        exclude = frozenset({inc.node_id}) if hook == "cordon" and inc.node_id else frozenset()
        d.after_hook(session, HookJob(inc.id, inc.acted_at, hook, "", {}, exclude), lost)
