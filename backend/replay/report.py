"""Compare what was decided (the record, the replay under the policy in force, the replay
under the candidate) per incident and in total (docs/replay.md, "The report").

An incident is the same one in two runs when its job, cause, root node and fault time
are (the fault time is its first evidence's own timestamp, the same in every run). Its
decisions are compared by what they did: the level and mode of each decision, the nodes
cordoned, the breaker's holds, the escalations, the status it ended in.
"""

from __future__ import annotations

import statistics
from typing import Any

from trainguard.backend.engine.policy import Policy
from trainguard.backend.replay.run import Outcome
from trainguard.backend.replay.trace import Trace

Key = tuple[str, str, str, float]


def key(inc: dict[str, Any]) -> Key:
    return (inc["job"] or "", inc["cause"], inc["node"] or "", round(inc["fault_at"] or 0.0, 6))


def summary(inc: dict[str, Any], cordons: list[dict[str, Any]]) -> dict[str, Any]:
    """What one incident did, in the terms compared."""
    decisions = inc["decisions"]
    return {
        "id": inc["id"],
        "status": inc["status"],
        "level": inc["level"],
        "decisions": [[d.get("level"), d.get("mode")] for d in decisions],
        "actions": [d.get("level") for d in decisions if d.get("restart")],
        "cordons": sorted(c["node"] for c in cordons if c["incident"] == inc["id"]),
        "breaker_holds": sum(1 for d in decisions if d.get("mode") == "breaker"),
        "escalations": inc["escalations"],
    }


COMPARED = ("status", "decisions", "actions", "cordons", "breaker_holds", "escalations")


def recovery_model(trace: Trace) -> dict[str, dict[str, Any]]:
    """Measured recovery (resumed - fault) of this cluster's resolved incidents, per
    level and launcher: {"launcher/torchrun": {median_s, n}, "launcher/*": ...}."""
    launchers: dict[str, str] = {}
    for r in trace["rank"]:
        launchers.setdefault(r["job"], r.get("launcher") or "unknown")
    times: dict[str, list[float]] = {}
    for inc in trace["incident"]:
        if inc["status"] != "resolved" or inc["resumed_at"] is None or inc["fault_at"] is None:
            continue
        acted = [d.get("level") for d in inc["decisions"] if d.get("restart")]
        if not acted:
            continue
        level = acted[-1]
        rec = inc["resumed_at"] - inc["fault_at"]
        times.setdefault(f"{level}/{launchers.get(inc['job'], 'unknown')}", []).append(rec)
        times.setdefault(f"{level}/*", []).append(rec)
    return {
        k: {"median_s": round(statistics.median(v), 3), "n": len(v)}
        for k, v in sorted(times.items())
    }


def _expected(
    model: dict[str, dict[str, Any]], level: str, launcher: str
) -> tuple[float | None, str, int]:
    for k in (f"{level}/{launcher}", f"{level}/*"):
        if k in model:
            return model[k]["median_s"], k, model[k]["n"]
    return None, "", 0


def totals(
    out: Outcome, trace: Trace, model: dict[str, dict[str, Any]]
) -> tuple[dict[str, Any], dict[Key, dict[str, Any]]]:
    """A run's totals, and each of its incidents' summary with its expected recovery."""
    launchers: dict[str, str] = {}
    world: dict[str, int] = {j["name"]: j.get("world_size") or 1 for j in trace["job"]}
    for r in trace["rank"]:
        launchers.setdefault(r["job"], r.get("launcher") or "unknown")
    per: dict[Key, dict[str, Any]] = {}
    actions: dict[str, int] = {}
    expected_s = 0.0
    gpu_s = 0.0
    unknown = 0
    for inc in out.incidents:
        if inc["trigger"] != "auto":
            continue
        sm = summary(inc, out.cordons)
        for level in sm["actions"]:
            actions[level] = actions.get(level, 0) + 1
        if sm["actions"]:
            level = sm["actions"][-1]
            exp: float | None
            if level == "stop_job":
                exp, n = max(0.0, trace.until - (inc["fault_at"] or trace.until)), 0
                basis = "stop_job: job time lost to the period's end"
            else:
                exp, basis, n = _expected(model, level, launchers.get(inc["job"], "unknown"))
            sm["expected_recovery_s"] = exp
            sm["recovery_basis"] = {"from": basis, "n": n}
            if exp is None:
                unknown += 1
            else:
                expected_s += exp
                gpu_s += exp * world.get(inc["job"], 1)
        per[key(inc)] = sm
    tot = {
        "incidents": len(per),
        "actions": dict(sorted(actions.items())),
        "cordons": len(out.cordons),
        "breaker_holds": sum(s["breaker_holds"] for s in per.values()),
        "escalations": sum(s["escalations"] for s in per.values()),
        "expected_recovery_s": round(expected_s, 3),
        "goodput_lost_s": round(expected_s, 3),
        "goodput_lost_gpu_s": round(gpu_s, 3),
        "recovery_unknown": unknown,
    }
    return tot, per


def recorded_outcome(trace: Trace) -> Outcome:
    cordons = [c for c in trace["cordon"] if c["at"] >= trace.since]
    return Outcome(policy="recorded", incidents=list(trace["incident"]), cordons=cordons)


def compare(trace: Trace, current: Outcome, candidate: Outcome | None = None) -> dict[str, Any]:
    """The report: the self-check (record vs the replay under the policy in force) and,
    given a candidate, where it differs from the policy in force."""
    model = recovery_model(trace)
    recorded = recorded_outcome(trace)
    runs = {"recorded": recorded, "current": current}
    if candidate is not None:
        runs["candidate"] = candidate
    done = {name: totals(o, trace, model) for name, o in runs.items()}
    keys = sorted({k for _, per in done.values() for k in per}, key=lambda k: (k[3], k[0], k[1]))
    rows = []
    mismatches = 0
    differ = 0
    for k in keys:
        row: dict[str, Any] = {"job": k[0], "cause": k[1], "node": k[2] or None, "fault_at": k[3]}
        for name, (_, per) in done.items():
            row[name] = per.get(k)
        # The live incident the record holds (its page, its timeline); the runs' own ids
        # are of their scratch databases.
        row["incident_id"] = row["recorded"]["id"] if row["recorded"] else None
        row["self_check"] = _same(row["recorded"], row["current"])
        mismatches += not row["self_check"]
        if candidate is not None:
            row["differs"] = not _same(row["current"], row["candidate"])
            differ += row["differs"]
        rows.append(row)
    return {
        "period": {"since": trace.since, "until": trace.until, "job": trace.job},
        "evidence": trace.decided_events(),
        "recovery_model": model,
        "totals": {name: tot for name, (tot, _) in done.items()},
        "self_check": {"incidents": len(rows), "mismatches": mismatches, "exact": mismatches == 0},
        "differences": differ if candidate is not None else None,
        "incidents": rows,
    }


def _same(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return all(a[f] == b[f] for f in COMPARED)


# Policy keys whose values are commands (they may carry hosts or credentials): a change
# is shown as set/empty, never the command, as GET /engine shows them.
_COMMANDS = {"hooks.cordon", "hooks.uncordon", "hooks.gpu_reset", "readmission.health_check"}


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{name}."))
        else:
            out[name] = "set" if name in _COMMANDS and v else "empty" if name in _COMMANDS else v
    return out


def policy_changes(current: Policy, candidate: Policy) -> list[dict[str, Any]]:
    """The keys where the candidate differs from the policy in force, with both values
    (dotted names, as in the policy file); shadow rules as `<rule> (shadow)`."""
    a = _flat(current.model.model_dump(mode="json"))
    b = _flat(candidate.model.model_dump(mode="json"))
    for policy, flat in ((current, a), (candidate, b)):
        flat.update({f"{rule} (shadow)": action for rule, action in policy.shadow_rules.items()})
    return [
        {"key": k, "current": a.get(k), "candidate": b.get(k)}
        for k in sorted(a.keys() | b.keys())
        if a.get(k) != b.get(k)
    ]
