"""The checks of `trainguard bench chaos` over plain rows (pure functions): the rows the
runner (backend/bench/chaos.py) collects, the incidents' invariants, the wrongful actions,
which incident each injected fault got, and the recovery time per fault kind. The report
that puts them together is backend/bench/chaos_report.py; docs/benchmarks-chaos.md says
how to read it.

- wrongful actions: (a) engine cordons with no hard XID / gpu_lost event on that node
  within `lookback_s` before, and no agent death of that node (dead then, or back less than
  `lookback_s` before); (b) commands to a node from which the job reported no step and no
  event within `host_window_s` before the command was issued;
- recovery per fault kind, p50/p99: the API's (`recovery_s` of the fault's incident) and
  the observed one (fault -> the job's first step of a newer generation, from the steps
  the ranks reported);
- invariants: the timeline's timestamps present are in TIMELINE order, and
  recovery_s = resumed_at - fault_at.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.backend.models import TIMELINE
from trainguard.protocol.xid import describe_xid

# The XID buckets that say nothing about the node's hardware (DESIGN.md "Do no harm": a
# hard XID is evidence, these are not); every other bucket, and gpu_lost, is hard.
SOFT_BUCKETS = frozenset({"RESTART_APP", "IGNORE", "UNKNOWN"})
ENDED_STATES = frozenset({"finished", "failed", "stopped"})
JOB_KINDS = ("exception", "sigkill", "hang")
# The bench's faults from outside the job (chaos_outside.py); the agent kinds stop no rank.
OUTSIDE_KINDS = ("agent_death", "agent_stop", "user_sigterm", "manual_restart")
AGENT_KINDS = frozenset({"agent_death", "agent_stop"})
FAULT_KINDS = (*JOB_KINDS, "xid", *OUTSIDE_KINDS)
# Faults that must open no incident: an agent's graceful stop (its node reads agent_down)
# and the user's own SIGTERM of the job (the job ends, stopped; no fault of trainguard's).
NO_INCIDENT_KINDS = frozenset({"agent_stop", "user_sigterm"})
# The incident causes a fault kind produces (a rank fault shows as any of the job causes:
# the faulty rank's own report, its peers' gloo errors, the launcher's view of it).
_JOB_CAUSES = frozenset({"exception", "hang", "rank_exit", "heartbeat_lost"})
KIND_CAUSES = {
    **{k: _JOB_CAUSES for k in JOB_KINDS},
    "xid": frozenset({"xid 79", "gpu_lost"}),
    "agent_death": frozenset({"node_down"}),
    "agent_stop": frozenset({"node_down"}),
    "user_sigterm": _JOB_CAUSES | {"node_down"},
    "manual_restart": frozenset({"operator"}),
}


@dataclass(frozen=True)
class Fault:
    """One injected fault: a rank's (from its marker file) or an agent kill (the bench's)."""

    kind: str  # exception | sigkill | hang | xid, or one of OUTSIDE_KINDS
    ts: float
    job: str | None  # agent_*: the job running when the agent was killed or stopped
    node: str | None  # None for user_sigterm and manual_restart (every node of the job)
    rank: int | None = None
    step: int | None = None
    index: int | None = None  # the fault's index in its job run's plan
    down_s: float | None = None  # agent_*: how long the agent was down
    agent_down: bool = False  # a rank fault that fired while its node's agent was dead

    @property
    def key(self) -> str:
        if self.kind in AGENT_KINDS:
            return f"{self.kind}:{self.node}@{self.ts:.3f}"
        if self.index is None:
            return f"{self.kind}:{self.job}@{self.ts:.3f}"
        return f"{self.job}#{self.index}"


@dataclass(frozen=True)
class Step:
    job: str
    node: str
    rank: int
    start: float
    end: float
    attempt: int = 0
    iteration: int = 0


@dataclass(frozen=True)
class Command:
    id: str
    job: str
    node: str
    action: str
    issued_at: float
    incident_id: int | None = None


@dataclass(frozen=True)
class Cordon:
    """A node cordon, from audit_log today (action "cordon"); see chaos.read_cordons."""

    ts: float
    node: str
    actor: str
    reason: str = ""


@dataclass(frozen=True)
class NodeEvent:
    """An event row: hardware evidence (kind xid / gpu_lost) or a job's event (job set)."""

    ts: float
    node: str
    kind: str
    xid: int | None = None
    job: str | None = None


def rounded(v: float | None, nd: int = 3) -> float | None:
    return None if v is None else round(v, nd)


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile, linear between the closest ranks (numpy's default)."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary(values: Iterable[float | None]) -> dict[str, Any]:
    xs = [v for v in values if v is not None]
    return {
        "n": len(xs),
        "p50": rounded(percentile(xs, 50)),
        "p99": rounded(percentile(xs, 99)),
        "max": rounded(max(xs)) if xs else None,
    }


def is_hard(kind: str, xid: int | None) -> bool:
    if kind == "gpu_lost":
        return True
    return kind == "xid" and xid is not None and describe_xid(xid).action not in SOFT_BUCKETS


def incident_time(inc: dict[str, Any]) -> float:
    """When an incident's fault was: its timeline's fault_at, else its creation."""
    t = (inc.get("timeline") or {}).get("fault_at")
    return float(t if t is not None else inc.get("created_at") or 0.0)


def outcome_kind(text: str | None) -> str:
    """An outcome with its numbers blanked, so that like outcomes count together."""
    out = re.sub(r"\d+(?:\.\d+)?", "N", (text or "").strip())
    return out[:120] or "(none)"


# --- incidents and their invariants ----------------------------------------------------


def incident_counts(incidents: Sequence[dict[str, Any]]) -> dict[str, Any]:
    outcomes: dict[str, Counter[str]] = defaultdict(Counter)
    for i in incidents:
        outcomes[str(i.get("status"))][outcome_kind(i.get("outcome"))] += 1
    return {
        "total": len(incidents),
        "by_status": dict(Counter(str(i.get("status")) for i in incidents).most_common()),
        "by_outcome": {s: dict(c.most_common()) for s, c in sorted(outcomes.items())},
        "by_cause": dict(Counter(str(i.get("cause")) for i in incidents).most_common()),
        "by_level": dict(Counter(str(i.get("level")) for i in incidents).most_common()),
    }


def timeline_problems(inc: dict[str, Any]) -> list[str]:
    """The timestamps present must be in TIMELINE order; recovery_s = resumed - fault."""
    tl = inc.get("timeline") or {}
    present = [(k, float(tl[k])) for k in TIMELINE if tl.get(k) is not None]
    problems = [
        f"{b} is {ta - tb:.3f} s before {a}"
        for (a, ta), (b, tb) in itertools.pairwise(present)
        if tb < ta
    ]
    fault, resumed, rec = tl.get("fault_at"), tl.get("resumed_at"), inc.get("recovery_s")
    if fault is not None and resumed is not None:
        want = resumed - fault
        if rec is None or abs(rec - want) > 1e-6:
            problems.append(f"recovery_s {rec} != resumed_at - fault_at = {want:.3f}")
    elif rec is not None:
        problems.append(f"recovery_s {rec} without both fault_at and resumed_at")
    return problems


def invariants(incidents: Sequence[dict[str, Any]]) -> dict[str, Any]:
    violations = [
        {"incident": i["id"], "status": i.get("status"), "problems": p}
        for i in incidents
        if (p := timeline_problems(i))
    ]
    unresumed = [
        i["id"]
        for i in incidents
        if i.get("status") == "resolved" and (i.get("timeline") or {}).get("resumed_at") is None
    ]
    return {
        "checked": len(incidents),
        "violations": violations,
        "resolved_without_resumed_at": unresumed,
    }


# --- wrongful actions ------------------------------------------------------------------


def _incident_of(reason: str) -> int | None:
    m = re.search(r"incident (\d+)", reason or "")
    return int(m.group(1)) if m else None


def judge_cordons(
    cordons: Sequence[Cordon],
    node_events: Sequence[NodeEvent],
    agent_deaths: Sequence[Fault],
    lookback_s: float = 120.0,
    slack_s: float = 1.0,
) -> dict[str, Any]:
    """Each engine cordon, rightful when the node had hardware or reachability evidence:
    a hard XID / gpu_lost event on it within `lookback_s` before (the engine acts on no
    older evidence: policy incidents.max_evidence_age_s), or an agent death of it (the
    agent dead at the cordon, or back less than `lookback_s` before). Operators' cordons
    are listed apart, not judged."""
    rows = []
    for c in sorted(cordons, key=lambda c: c.ts):
        if c.actor != "engine":
            continue
        hw = [
            e
            for e in node_events
            if e.node == c.node
            and is_hard(e.kind, e.xid)
            and c.ts - lookback_s <= e.ts <= c.ts + slack_s
        ]
        deaths = [
            d
            for d in agent_deaths
            if d.node == c.node
            and d.ts <= c.ts + slack_s
            and c.ts <= d.ts + (d.down_s or 0.0) + lookback_s
        ]
        evidence = [
            f"{e.kind}{' ' + str(e.xid) if e.xid is not None else ''} {e.ts - c.ts:+.1f} s"
            for e in hw
        ] + [f"agent killed {d.ts - c.ts:+.1f} s, dead {d.down_s:.1f} s" for d in deaths]
        rows.append(
            {
                "ts": c.ts,
                "node": c.node,
                "incident": _incident_of(c.reason),
                "reason": c.reason[:200],
                "rightful": bool(evidence),
                "evidence": evidence,
            }
        )
    wrongful = [r for r in rows if not r["rightful"]]
    return {
        "total": len(rows),
        "wrongful": len(wrongful),
        "wrongful_list": wrongful,
        "by_others": sum(1 for c in cordons if c.actor != "engine"),
        "list": rows,
    }


def judge_commands(
    commands: Sequence[Command],
    steps: Sequence[Step],
    node_events: Sequence[NodeEvent],
    host_window_s: float = 60.0,
    slack_s: float = 1.0,
) -> dict[str, Any]:
    """Each command, wrongful when its job reported nothing (no step ended, no job event)
    from its node within `host_window_s` before it was issued: the node hosted no ranks of
    the job then (a job stalled by a hang still reports from its nodes within the window)."""
    seen: dict[tuple[str, str], list[float]] = defaultdict(list)
    for s in steps:
        seen[(s.job, s.node)].append(s.end)
    for e in node_events:
        if e.job is not None:
            seen[(e.job, e.node)].append(e.ts)
    for v in seen.values():
        v.sort()
    wrongful = []
    for c in sorted(commands, key=lambda c: c.issued_at):
        ts = seen.get((c.job, c.node), [])
        i = bisect.bisect_right(ts, c.issued_at + slack_s)
        last = ts[i - 1] if i else None
        if last is None or last < c.issued_at - host_window_s:
            wrongful.append(
                {
                    "id": c.id,
                    "job": c.job,
                    "node": c.node,
                    "action": c.action,
                    "incident": c.incident_id,
                    "issued_at": c.issued_at,
                    "last_report_s_before": rounded(c.issued_at - last)
                    if last is not None
                    else None,
                }
            )
    return {"total": len(commands), "wrongful": len(wrongful), "wrongful_list": wrongful}


# --- faults and their incidents --------------------------------------------------------


def _fits(f: Fault, inc: dict[str, Any], window_s: float, before_s: float) -> bool:
    """The incident may be the fault's: the same job, its fault_at in the fault's window,
    and its cause (or a piece of its evidence) one the fault's kind produces."""
    if inc.get("job") != f.job:
        return False
    t = incident_time(inc)
    if not f.ts - before_s <= t <= f.ts + window_s + (f.down_s or 0.0):
        return False
    causes = KIND_CAUSES.get(f.kind, frozenset())
    ev = inc.get("evidence") or []
    return inc.get("cause") in causes or any(
        e.get("kind") in causes or e.get("cause") in causes for e in ev
    )


def _joined(f: Fault, inc: dict[str, Any], window_s: float, before_s: float) -> bool:
    """Evidence of the fault's kind, from the fault's window, joined the incident (which
    may have opened before the fault: another fault's)."""
    if inc.get("job") != f.job:
        return False
    causes = KIND_CAUSES.get(f.kind, frozenset())
    hi = f.ts + window_s + (f.down_s or 0.0)
    return any(
        (e.get("kind") in causes or e.get("cause") in causes)
        and e.get("ts") is not None
        and f.ts - before_s <= float(e["ts"]) <= hi
        for e in inc.get("evidence") or []
    )


def _score(f: Fault, inc: dict[str, Any]) -> int:
    ev = inc.get("evidence") or []
    nodes = {inc.get("node")} | {e.get("node") for e in ev}
    ranks = {e.get("rank") for e in ev}
    return (
        4 * (inc.get("cause") in KIND_CAUSES.get(f.kind, ()))
        + 2 * (f.rank is not None and f.rank in ranks)
        + (f.node is not None and f.node in nodes)
    )


def match_faults(
    faults: Sequence[Fault],
    incidents: Sequence[dict[str, Any]],
    window_s: float = 30.0,
    before_s: float = 1.0,
) -> dict[str, Any]:
    """Each fault's incident: of the same job, its fault_at from `before_s` before the fault
    to `window_s` after (plus the agent's dead time for an agent death), with a cause or
    evidence the fault's kind produces (KIND_CAUSES). The best pairs first (its root cause
    is of the kind, its evidence names the fault's rank, its node), then the closest in
    time. A fault without one of its own shares another fault's incident when evidence of
    its kind from its window joined that incident; an incident left over that fits a fault
    is an extra incident of it; the rest fit no fault."""
    pairs = [
        (-_score(f, i), abs(incident_time(i) - f.ts), fi, ii)
        for fi, f in enumerate(faults)
        for ii, i in enumerate(incidents)
        if _fits(f, i, window_s, before_s)
    ]
    pairs.sort()
    of_fault: dict[int, int] = {}
    of_incident: dict[int, int] = {}
    for _s, _dt, fi, ii in pairs:
        if fi not in of_fault and ii not in of_incident:
            of_fault[fi], of_incident[ii] = ii, fi
    extra: dict[int, int] = {}
    for _s, _dt, fi, ii in pairs:
        if ii not in of_incident and ii not in extra:
            extra[ii] = fi
    shared: dict[int, int] = {}
    for fi, f in enumerate(faults):
        if fi in of_fault:
            continue
        joined = [
            (abs(incident_time(i) - f.ts), ii)
            for ii, i in enumerate(incidents)
            if ii in of_incident and _joined(f, i, window_s, before_s)
        ]
        if joined:
            shared[fi] = min(joined)[1]
    return {
        "incident_of": {fi: incidents[ii]["id"] for fi, ii in of_fault.items()},
        "shared": {fi: incidents[ii]["id"] for fi, ii in shared.items()},
        "extra": {incidents[ii]["id"]: faults[fi].key for ii, fi in extra.items()},
        "unexplained": [
            i["id"] for ii, i in enumerate(incidents) if ii not in of_incident and ii not in extra
        ],
    }


def steps_by_job_name(steps: Sequence[Step]) -> dict[str, list[Step]]:
    out: dict[str, list[Step]] = defaultdict(list)
    for s in steps:
        out[s.job].append(s)
    for v in out.values():
        v.sort(key=lambda s: s.end)
    return out


def stepped_again(
    job_steps: Sequence[Step], t: float, until: float, newer_than: tuple[int, int] | None = None
) -> float | None:
    """When the job had completed a step again: a step started at or after t and before
    `until` (of a generation newer than `newer_than`), the latest of the ranks' first such
    steps' ends; None if there is none. In data-parallel training every step needs every
    rank (its all-reduce), so one rank's step is the job's; the ranks whose agent was dead
    went unseen, so the ranks seen are taken."""
    first: dict[int, float] = {}
    for s in job_steps:
        if s.rank in first or s.start < t or s.start >= until:
            continue
        if newer_than is not None and (s.attempt, s.iteration) <= newer_than:
            continue
        first[s.rank] = s.end
    return max(first.values()) if first else None


def observed_recovery(f: Fault, job_steps: Sequence[Step], until: float) -> float | None:
    """Fault -> the first step of a newer generation (attempt, iteration) than the job's at
    the fault, before `until` (the job's next rank fault); None when the job did not
    restart in between (an XID the job ran through, an agent death nobody acted on)."""
    before = [(s.attempt, s.iteration) for s in job_steps if s.end <= f.ts]
    if not before:
        return None
    done = stepped_again(job_steps, f.ts, until, newer_than=max(before))
    return rounded(done - f.ts) if done is not None else None


def next_rank_fault(faults: Sequence[Fault], f: Fault, stop: float) -> float:
    """When the job's next fault that stops ranks fired (an agent down stops none), else
    `stop`."""
    later = [g.ts for g in faults if g.job == f.job and g.kind not in AGENT_KINDS and g.ts > f.ts]
    return min(later, default=stop)


def recovery_by_kind(
    faults: Sequence[Fault],
    matched: dict[int, int],
    incidents: dict[int, dict[str, Any]],
    steps_by_job: dict[str, list[Step]],
    stop: float,
) -> tuple[dict[str, Any], list[float | None]]:
    """Per kind: the API's recovery (its incident's recovery_s) and the observed one."""
    api: dict[str, list[float | None]] = defaultdict(list)
    seen: dict[str, list[float | None]] = defaultdict(list)
    observed: list[float | None] = []
    for fi, f in enumerate(faults):
        until = next_rank_fault(faults, f, stop)
        o = observed_recovery(f, steps_by_job.get(str(f.job), []), until)
        observed.append(o)
        seen[f.kind].append(o)
        inc = incidents.get(matched[fi]) if fi in matched else None
        api[f.kind].append(inc.get("recovery_s") if inc else None)
    kinds = [k for k in FAULT_KINDS if k in api] + sorted(set(api) - set(FAULT_KINDS))
    return {
        k: {
            "faults": len(api[k]),
            "api_recovery_s": summary(api[k]),
            "observed_recovery_s": summary(seen[k]),
        }
        for k in kinds
    }, observed
