"""The timeout hierarchy (docs/restarts.md, "Timeout hierarchy"): which timeout must be
shorter than which, checked on the timeouts a job's ranks reported (wire.Timeouts, stored
in `ranks.timeouts`). A violation is a warning with its fix in one sentence; it never
blocks the job. `refresh` stores a job's current violations and announces each new one
with a `timeouts` event (the analytics pass calls it for every active job).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainguard.backend.models import Event, Job, Rank


@dataclass(frozen=True)
class Rule:
    """`sum(shorter)` must stay below `longer`: the job's values are the largest sum of
    `shorter` over its ranks and the smallest `longer` (the tightest pair)."""

    code: str
    shorter: tuple[str, ...]
    longer: str
    says: str  # what goes wrong, with {shorter} and {longer}
    fix: str  # one sentence


RULES: tuple[Rule, ...] = (
    Rule(
        "collective_over_checkpoint",
        ("checkpoint_save_s",),
        "collective_s",
        "the longest checkpoint save ({shorter}) is not shorter than the process group's "
        "timeout ({longer}): ranks that finished their part of a save die in the next "
        "collective while the slowest one still saves",
        "Raise init_process_group(timeout=...) above the longest save, or save with "
        "torch.distributed.checkpoint.async_save so the save does not block the collectives.",
    ),
    Rule(
        "wrapper_soft_over_checkpoint",
        ("checkpoint_save_s",),
        "wrapper_soft_s",
        "the longest checkpoint save ({shorter}) is not shorter than the NVRx Wrapper's "
        "soft_timeout ({longer}): the Wrapper takes a save for a hang and restarts healthy "
        "ranks",
        "Raise the Wrapper's soft_timeout (and hard_timeout with it) above the longest save.",
    ),
    Rule(
        "launcher_heartbeat_over_checkpoint",
        ("checkpoint_save_s",),
        "launcher_heartbeat_s",
        "the longest checkpoint save ({shorter}) is not shorter than ft_launcher's rank "
        "heartbeat timeout ({longer}): the launcher ends a rank that is saving",
        "Raise --ft-rank-heartbeat-timeout above the longest save, or send an FT heartbeat "
        "around the save.",
    ),
    Rule(
        "hang_under_launcher_heartbeat",
        ("hang_s",),
        "launcher_heartbeat_s",
        "trainguard's hang threshold ({shorter}) is not shorter than ft_launcher's rank "
        "heartbeat timeout ({longer}): the launcher restarts the whole group before "
        "trainguard sees the hang and can restart it in process",
        "Raise --ft-rank-heartbeat-timeout above trainguard's hang threshold (by "
        "default 10 times the rank's step time, at least 2 s).",
    ),
    Rule(
        "first_step_under_launcher_initial",
        ("first_step_s",),
        "launcher_initial_heartbeat_s",
        "trainguard's first-step allowance ({shorter}) is not shorter than ft_launcher's "
        "initial rank heartbeat timeout ({longer}): a rank stuck in its set-up is ended by "
        "the launcher before trainguard reports it",
        "Raise --ft-initial-rank-heartbeat-timeout above trainguard's first-step allowance "
        "(120 s by default).",
    ),
    Rule(
        "wrapper_soft_under_hard",
        ("wrapper_soft_s",),
        "wrapper_hard_s",
        "the NVRx Wrapper's soft_timeout ({shorter}) is not shorter than its hard_timeout "
        "({longer}): a hung rank is terminated before it can restart in process",
        "Set the Wrapper's soft_timeout below its hard_timeout.",
    ),
    Rule(
        "wrapper_restart_under_launcher_heartbeat",
        ("wrapper_hard_s", "wrapper_barrier_s"),
        "launcher_heartbeat_s",
        "an in-process restart may take the Wrapper's hard_timeout plus its barrier_timeout "
        "({shorter}), not shorter than ft_launcher's rank heartbeat timeout ({longer}): the "
        "launcher ends the ranks in the middle of their in-process restart",
        "Raise --ft-rank-heartbeat-timeout above the Wrapper's hard_timeout plus barrier_timeout.",
    ),
    Rule(
        "launcher_check_under_heartbeat",
        ("launcher_check_interval_s",),
        "launcher_heartbeat_s",
        "ft_launcher's workload check interval ({shorter}) is not shorter than its rank "
        "heartbeat timeout ({longer}): a missed heartbeat is seen up to a whole interval "
        "late",
        "Set --ft-workload-check-interval well below --ft-rank-heartbeat-timeout.",
    ),
    Rule(
        "monitor_interval_under_restart_wait",
        ("monitor_interval_s",),
        "restart_wait_s",
        "the launcher's monitor interval ({shorter}) is not shorter than trainguard's wait "
        "for new workers ({longer}): a launcher restart trainguard asks for is acked "
        "failed before the launcher notices its workers are gone",
        "Lower the launcher's --monitor-interval (torchrun and ft_launcher default to 0.1 s).",
    ),
)


def _seconds(v: float) -> str:
    return f"{v:g} s"


def check(timeouts: Iterable[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """The violations of RULES by the reported timeouts of a job's ranks, in RULES'
    order: {code, message, fix, shorter, longer, values}."""
    reports = [t for t in timeouts if t]
    out = []
    for rule in RULES:
        shorter: float | None = None
        longer: float | None = None
        for t in reports:
            parts = [t.get(k) for k in rule.shorter]
            if all(isinstance(p, int | float) for p in parts):
                total = float(sum(parts))  # type: ignore[arg-type]  # numbers, checked above
                shorter = total if shorter is None else max(shorter, total)
            v = t.get(rule.longer)
            if isinstance(v, int | float):
                longer = float(v) if longer is None else min(longer, float(v))
        if shorter is None or longer is None or shorter < longer:
            continue
        out.append(
            {
                "code": rule.code,
                "message": rule.says.format(shorter=_seconds(shorter), longer=_seconds(longer)),
                "fix": rule.fix,
                "shorter": shorter,
                "longer": longer,
                "values": {"+".join(rule.shorter): shorter, rule.longer: longer},
            }
        )
    return out


def job_timeouts(session: Session, job_id: int, since: float) -> list[dict[str, Any] | None]:
    """The timeouts the job's live ranks reported; those of all its ranks when none is
    live (an ended job keeps its warnings)."""
    rows = session.execute(
        select(Rank.timeouts, Rank.alive, Rank.updated_at).where(Rank.job_id == job_id)
    ).all()
    live = [t for t, alive, updated in rows if alive and updated >= since]
    return live if live else [t for t, _, _ in rows]


def warnings(session: Session, job_id: int, since: float) -> list[dict[str, Any]]:
    return check(job_timeouts(session, job_id, since))


def refresh(session: Session, job: Job, since: float, now: float) -> list[Event]:
    """Store the job's current violations; a `timeouts` event for each one it did not
    have at the last check (a checkpoint that grew past a timeout, a restarted rank with
    other settings). Added to the session, not committed."""
    found = warnings(session, job.id, since)
    codes = [w["code"] for w in found]
    before = set(job.timeout_warnings or [])
    if codes != list(job.timeout_warnings or []):
        job.timeout_warnings = codes
    events = [
        Event(
            ts=now,
            received_at=now,
            kind="timeouts",
            job=job.name,
            message=f"timeout hierarchy: {w['message']}. Fix: {w['fix']}",
            data={
                "code": w["code"],
                "fix": w["fix"],
                "shorter_s": w["shorter"],
                "longer_s": w["longer"],
            },
        )
        for w in found
        if w["code"] not in before
    ]
    session.add_all(events)
    return events
