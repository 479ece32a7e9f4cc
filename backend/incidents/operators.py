"""The incidents an operator opens or answers: a manual restart of a job (within the
launcher's restart budget), a job that does not start, and the answer to a dry-run
recommendation or a held action (approve / reject, audited with the reason). Each goes
through the incident transitions of incidents/service.py."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainguard.backend import audit
from trainguard.backend.cluster import cordons
from trainguard.backend.errors import Conflict, NotFound
from trainguard.backend.incidents import service
from trainguard.backend.jobs.service import (
    capabilities,
    get_or_create_job,
    launcher_budget,
    live_ranks,
    set_job_state,
)
from trainguard.backend.models import Incident, Job, Node, Rank


def approve(session: Session, incident_id: int, who: str, reason: str) -> Incident:
    """Approve a pending incident: the engine carries its level out at its next cycle."""
    inc = _pending(session, incident_id)
    now = _answer(session, inc, who, reason, "approval", "approve")
    inc.status = "open"
    inc.not_before = now
    inc.outcome = f"approved by {who}"
    session.flush()
    return inc


def reject(session: Session, incident_id: int, who: str, reason: str) -> Incident:
    inc = _pending(session, incident_id)
    now = _answer(session, inc, who, reason, "rejection", "reject")
    inc.status = "rejected"
    inc.closed_at = now
    inc.outcome = f"rejected by {who}: {reason}"
    session.flush()
    return inc


def _pending(session: Session, incident_id: int) -> Incident:
    inc = session.get(Incident, incident_id, with_for_update=True, populate_existing=True)
    if inc is None:
        raise NotFound(f"no incident {incident_id}")
    if inc.status != "pending":
        raise Conflict(f"incident {incident_id} is {inc.status}, not awaiting approval")
    return inc


def _answer(session: Session, inc: Incident, who: str, reason: str, mode: str, verb: str) -> float:
    """An operator's answer to a recommendation: a decision entry and an audit row."""
    now = time.time()
    service.add_decision(
        session, inc, {"at": now, "level": inc.level, "why": reason, "by": who, "mode": mode}
    )
    audit.record(
        session,
        ts=now,
        actor=who,
        action=f"{verb}:{inc.level}",
        target=f"incident:{inc.id}",
        reason=reason,
    )
    return now


def manual_restart(
    session: Session,
    job: Job,
    level: str,
    reason: str,
    actor: str,
    fresh_within_s: float,
    force: bool = False,
) -> Incident:
    """An operator's restart: an incident opened and acted on at once, at `level`, on
    every node with live ranks of the job (audited). A launcher restart that would use
    the launcher's last restart (restarts left <= 1) is refused unless `force`."""
    ranks = live_ranks(session, job, fresh_within_s)
    if not ranks:
        raise Conflict(f"job {job.name!r} has no live ranks to restart")
    now = time.time()
    caps = capabilities(session, job.id, now - fresh_within_s)
    if level not in caps["levels"]:
        raise Conflict(
            f"job {job.name!r} cannot carry out {_a(level)} {level} restart: {why_not(level, caps)}"
        )
    if level == "launcher":
        budget = launcher_budget(session, job.id, now - fresh_within_s)
        left = budget["restarts_left"]
        if left is not None and left <= LAST_LAUNCHER_RESTART:
            if not force:
                raise Conflict(
                    f"job {job.name!r}: {budget_text(budget)}; relaunch the job with a larger "
                    "--max-restarts to raise the budget, or send force: true to use it anyway",
                    code=RESTART_BUDGET,
                )
            reason = f"{reason} (forced: {budget_text(budget)})"
    inc = _operator_incident(session, job, level, reason, actor, now)
    service.take_action(session, inc, now, restart=True)
    service.add_decision(
        session,
        inc,
        {"at": now, "level": level, "why": reason, "by": actor, "mode": "manual", "restart": True},
    )
    targets: dict[int, list[int]] = {}
    for rank, _ in ranks:
        targets.setdefault(rank.node_id, []).append(rank.rank)
    service.issue_commands(session, inc, level, targets, now, reason, fault=False)
    audit.record(
        session,
        ts=now,
        actor=actor,
        action=f"restart:{level}",
        target=f"job:{job.name}",
        reason=reason,
    )
    session.flush()
    return inc


def _operator_incident(
    session: Session,
    job: Job,
    level: str,
    reason: str,
    actor: str,
    now: float,
    node_id: int | None = None,
) -> Incident:
    """An incident an operator's action opens: its fault is the action, now."""
    return service.open_incident(
        session,
        job,
        now=now,
        trigger="manual",
        triggered_by=actor,
        cause="operator",
        level=level,
        reason=reason,
        fault_at=now,
        detected_at=now,
        fault_step=job.last_step,
        node_id=node_id,
    )


# The conflict code of a cordon that would take a node out of running jobs without force.
LIVE_RANKS = "live_ranks"


def cordon_node(
    session: Session,
    node: Node,
    actor: str,
    reason: str,
    *,
    force: bool,
    fresh_within_s: float,
    leave_grace_s: float,
) -> tuple[bool, list[Incident]]:
    """An operator's cordon. A node hosting live ranks is taken out of their jobs as the
    engine's exclusion does it (docs/engine.md, "A node leaves the job"): for each job an
    incident at exclude_node, an exclude_node command to the node (not where it is the
    job's only node) and a launcher restart of the job's other nodes. That is refused
    (409, code live_ranks) unless `force`. Returns (changed, the incidents opened)."""
    now = time.time()
    rows = session.execute(
        select(Rank.job_id, Rank.rank)
        .where(
            Rank.node_id == node.id,
            Rank.alive.is_(True),
            Rank.updated_at >= now - fresh_within_s,
        )
        .order_by(Rank.job_id, Rank.rank)
    ).all()
    here: dict[int, list[int]] = {}
    for job_id, rank in rows:
        here.setdefault(job_id, []).append(rank)
    jobs = [j for j in (session.get(Job, i) for i in here) if j is not None]
    if jobs and not node.cordoned and not force:
        hosted = "; ".join(f"job {j.name} (rank {', '.join(map(str, here[j.id]))})" for j in jobs)
        raise Conflict(
            f"{node.name} hosts live ranks of {hosted}: cordoning it takes it out of them "
            "(its launcher there is ended, the other nodes restart without it); send force: "
            "true (CLI: --force) to go ahead",
            code=LIVE_RANKS,
        )
    if cordons.cordon(session, node, actor, reason, now) is None:
        return False, []
    opened = [
        _exclude_by_hand(session, job, node, actor, reason, now, fresh_within_s, leave_grace_s)
        for job in jobs
    ]
    session.flush()
    return True, opened


def _exclude_by_hand(
    session: Session,
    job: Job,
    node: Node,
    actor: str,
    reason: str,
    now: float,
    fresh_within_s: float,
    leave_grace_s: float,
) -> Incident:
    why = f"cordoned by {actor}: {reason}"
    inc = _operator_incident(session, job, "exclude_node", why, actor, now, node.id)
    service.take_action(session, inc, now, restart=True)
    hosts: dict[int, list[int]] = {}
    for rank, _ in live_ranks(session, job, fresh_within_s):
        hosts.setdefault(rank.node_id, []).append(rank.rank)
    entry: dict[str, Any] = {
        "at": now,
        "level": "exclude_node",
        "why": why,
        "by": actor,
        "mode": "manual",
        "restart": True,
        "node": node.name,
    }
    service.leave_job(session, inc, job, node, hosts, now, leave_grace_s, entry)
    others = {n: ranks for n, ranks in hosts.items() if n != node.id}
    if others:
        service.issue_commands(session, inc, "launcher", others, now, why, fault=False)
    service.add_decision(session, inc, entry)
    return inc


# The cause of an incident about a job that does not start: its launcher gave up before
# any step (the rendezvous closed, the workers never came up). Nothing to act on.
LAUNCH_FAILED = "launch_failed"


def launch_failure(session: Session, job_name: str, reason: str, actor: str) -> Incident:
    """A launcher of `job_name` gave up without the job training, for `reason` (its last
    error line). The job reads `failed`, "the job does not start: ...", and one incident
    (failed, no action taken) says so; a later report of the same job updates it. The
    job is made when no rank of it ever reported (audited)."""
    now = time.time()
    job = get_or_create_job(session, job_name, now)
    text = f"the job does not start: {reason}"[:2000]
    set_job_state(job, "failed", now, text)
    inc = session.scalar(
        select(Incident)
        .where(Incident.job_id == job.id, Incident.cause == LAUNCH_FAILED)
        .order_by(Incident.id.desc())
    )
    if inc is None or (job.last_step is not None and inc.fault_step != job.last_step):
        inc = service.open_incident(
            session,
            job,
            now=now,
            trigger="auto",
            triggered_by=actor,
            cause=LAUNCH_FAILED,
            level="launcher",
            reason=text,
            fault_at=now,
            detected_at=now,
            fault_step=job.last_step,
        )
    service.add_decision(
        session, inc, {"at": now, "level": "launcher", "why": text, "by": actor, "mode": "observed"}
    )
    service.fail(session, inc, now, text)
    audit.record(
        session, ts=now, actor=actor, action="launch_failed", target=f"job:{job_name}", reason=text
    )
    session.flush()
    return inc


def _a(word: str) -> str:
    """The indefinite article before a level's name: an in_process, a launcher."""
    return "an" if word[:1] in "aeiou" else "a"


# The launcher's restart budget (--max-restarts, shared by faults and operator restarts):
# a launcher restart with this many left or fewer uses its last one, and the next worker
# failure ends the job. The engine holds there too (engine/decide.py).
LAST_LAUNCHER_RESTART = 1


RESTART_BUDGET = "restart_budget"  # the code of the 409 that a force overrides


def budget_text(budget: Mapping[str, int | None]) -> str:
    """The launcher's budget in words, for a refusal or a decision."""
    most, used, left = budget["max_restarts"], budget["restart_count"], budget["restarts_left"]
    head = f"the launcher allows {most} restarts (--max-restarts) and has used {used}"
    if left == 0:
        return f"{head}: none is left, a launcher restart ends the job (the launcher gives up)"
    if left == 1:
        return (
            f"{head}: a launcher restart would use the last one, "
            "and the next worker failure after it ends the job"
        )
    return f"{head}: {left} left"


def why_not(level: str, caps: dict[str, Any]) -> str:
    if level == "in_process":
        return "not every live rank runs under NVRx's inprocess.Wrapper (declared by the SDK)"
    return "no launcher (torchrun, ft_launcher) respawns its ranks"
