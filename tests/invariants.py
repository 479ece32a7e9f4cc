"""Invariants that hold over every incident a test produced, whatever the test was about
(checked after every test that built an app over a database, see tests/conftest.py):

- the timestamps present are in the order fault <= detected <= decided <= delivered <=
  torn_down <= restarted <= resumed;
- recovery_s (the API's) = resumed_at - fault_at;
- every command went to a node that hosted ranks of its job;
- an incident whose job resumed after its action is never `failed`.
"""

from __future__ import annotations

import itertools

from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from trainguard.backend.analytics import repository as steps
from trainguard.backend.incidents.reads import incident_dict
from trainguard.backend.models import TIMELINE, Command, Incident, Node, Rank, Step


def violations(url: str) -> list[str]:
    engine = create_engine(url)
    out: list[str] = []
    try:
        with Session(engine) as s:
            for inc in s.scalars(select(Incident).order_by(Incident.id)):
                out += incident_violations(s, inc)
            for cmd in s.scalars(select(Command)):
                hosted = s.scalar(
                    select(Rank.id).where(Rank.job_id == cmd.job_id, Rank.node_id == cmd.node_id)
                ) or s.scalar(
                    select(Step.id)
                    .where(Step.job_id == cmd.job_id, Step.node_id == cmd.node_id)
                    .limit(1)
                )
                if hosted is None:
                    node = s.get(Node, cmd.node_id)
                    out.append(
                        f"command {cmd.id} ({cmd.action}) went to {node.name if node else '?'}, "
                        "which hosted no rank of its job"
                    )
    finally:
        engine.dispose()
    return out


def incident_violations(s: Session, inc: Incident) -> list[str]:
    out: list[str] = []
    present = [(f, getattr(inc, f)) for f in TIMELINE if getattr(inc, f) is not None]
    for (fa, a), (fb, b) in itertools.pairwise(present):
        if b < a:
            out.append(f"incident {inc.id}: {fb} ({b:.3f}) before {fa} ({a:.3f})")
    d = incident_dict(s, inc)
    if inc.resumed_at is not None and inc.fault_at is not None:
        if abs(d["recovery_s"] - (inc.resumed_at - inc.fault_at)) > 1e-9:
            out.append(f"incident {inc.id}: recovery_s {d['recovery_s']} != resumed - fault")
    elif d["recovery_s"] is not None:
        out.append(f"incident {inc.id}: recovery_s without resumed_at/fault_at")
    if inc.status == "failed" and inc.acted_at is not None:
        first = steps.first_step_after(s, inc)
        if first is not None:
            out.append(
                f"incident {inc.id}: failed, but the job resumed after its action "
                f"(step {first.step} ended at {first.end:.3f})"
            )
    return out


def check(url: str) -> None:
    found = violations(url)
    assert not found, "incident invariants violated:\n  " + "\n  ".join(found)
