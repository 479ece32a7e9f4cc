"""The report of `trainguard bench chaos` (pure functions over the rows of
backend/bench/chaos_checks.py; the runner is backend/bench/chaos.py, the reading guide
docs/benchmarks-chaos.md): incidents by status and outcome, wrongful actions, recovery per
fault kind, the API against the processes, and the incidents' invariants.

The API against the processes: faults with no incident, incidents with no fault, incidents
resolved although the job made no step after their fault, incidents failed or stopped
although the job stepped again, and the state the API showed (node up or down, live
ranks and their pids, the job's state when the API has one) against the processes the
bench saw, as episodes that lasted longer than their grace.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from trainguard.backend.bench.chaos_checks import (
    ENDED_STATES,
    Command,
    Cordon,
    Fault,
    NodeEvent,
    Step,
    incident_counts,
    incident_time,
    invariants,
    judge_commands,
    judge_cordons,
    match_faults,
    recovery_by_kind,
    rounded,
    stepped_again,
    steps_by_job_name,
)

# seconds a disagreement must last before it counts (the API learns of a process within
# about a second; a new worker's first heartbeat follows its torch import)
STARTUP_S = 30.0  # a worker younger than this may not have said hello to its agent yet
GRACE_S = {
    "node_up_agent_dead": 10.0,
    "node_down_agent_alive": 10.0,
    "ranks": 20.0,
    "job_state": 30.0,
}


def _disagreements(obs: dict[str, Any], down_after_s: float) -> list[tuple[str, str, str]]:
    """(kind, subject, detail) of every disagreement in one observation."""
    ts = float(obs["ts"])
    out = []
    for name, n in (obs.get("nodes") or {}).items():
        status, last_seen = n.get("api_status"), n.get("api_last_seen")
        silent = last_seen is not None and ts - float(last_seen) > down_after_s
        api_down = status == "down" or (status == "cordoned" and silent)
        since = ts - float(n.get("agent_since") or ts)
        if not n.get("agent_alive"):
            if since > down_after_s and not api_down and status is not None:
                out.append(("node_up_agent_dead", name, f"agent dead {since:.0f} s, API {status}"))
            continue
        if api_down and since > 5.0:
            out.append(("node_down_agent_alive", name, f"agent alive {since:.0f} s, API down"))
        if since > 5.0:
            procs = {(int(r), int(p)): float(age) for r, p, age in n.get("proc_ranks") or []}
            api = {(int(x[0]), int(x[1])) for x in n.get("api_ranks") or []}
            # a live worker the API does not know, once past its start-up (imports,
            # rendezvous: it says hello to its agent after them), or a rank the API calls
            # alive with no such process
            unknown = sorted(k for k, age in procs.items() if k not in api and age >= STARTUP_S)
            gone = sorted(api - set(procs))
            if unknown or gone:
                out.append(
                    (
                        "ranks",
                        name,
                        f"(rank, pid) unknown to the API {unknown}, gone but alive in it {gone}",
                    )
                )
    for name, j in (obs.get("jobs") or {}).items():
        state = j.get("api_state")
        if state is None:
            continue
        ended = bool(j.get("ended"))
        want = ("finished" if j.get("exit_ok") else "ended") if ended else "active"
        wrong = (ended and state not in ENDED_STATES) or (not ended and state in ENDED_STATES)
        if ended and j.get("exit_ok") and state != "finished":
            wrong = True
        if wrong:
            out.append(("job_state", name, f"processes {want}, API {state}"))
    return out


def state_disagreements(
    observations: Sequence[dict[str, Any]],
    down_after_s: float,
    grace_s: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Episodes of consecutive observations in which the API's view of a node or job
    disagreed with the processes, kept when they lasted at least their grace."""
    grace = {**GRACE_S, **(grace_s or {})}
    open_: dict[tuple[str, str], dict[str, Any]] = {}
    episodes: list[dict[str, Any]] = []
    job_states = any(
        j.get("api_state") is not None for o in observations for j in (o.get("jobs") or {}).values()
    )
    for obs in sorted(observations, key=lambda o: o["ts"]):
        now = {(k, s): d for k, s, d in _disagreements(obs, down_after_s)}
        for key in list(open_):
            if key not in now:
                episodes.append(open_.pop(key))
        for (kind, subject), detail in now.items():
            ep = open_.setdefault(
                (kind, subject),
                {"kind": kind, "subject": subject, "from": obs["ts"], "detail": detail},
            )
            ep["to"] = obs["ts"]
    episodes += open_.values()
    kept = []
    for ep in sorted(episodes, key=lambda e: e["from"]):
        ep["duration_s"] = rounded(ep["to"] - ep["from"], 1)
        if ep["to"] - ep["from"] >= grace[ep["kind"]]:
            kept.append(ep)
    return {
        "observations": len(observations),
        "job_state_in_api": job_states,
        "by_kind": dict(Counter(e["kind"] for e in kept)),
        "episodes": kept,
    }


def api_vs_processes(
    faults: Sequence[Fault],
    matches: dict[str, Any],
    incidents: Sequence[dict[str, Any]],
    steps_by_job: dict[str, list[Step]],
    stop: float,
) -> dict[str, Any]:
    """Faults without incident, incidents without fault, and incidents whose status the
    job's steps contradict."""
    without, unseen = [], []
    for fi, f in enumerate(faults):
        if fi in matches["incident_of"] or fi in matches["shared"]:
            continue
        row = {"fault": f.key, "kind": f.kind, "ts": f.ts, "node": f.node, "rank": f.rank}
        # An agent death needs no incident: back before the node counts as down, or
        # silent while its ranks train on, which is an alert (agent_silent), not node
        # death (docs/engine.md, "Agent silence is not node death"); nor does a fault its
        # agent could not see (the agent dead when it fired).
        if f.kind == "agent_death" or f.agent_down:
            unseen.append(row)
        else:
            without.append(row)
    by_job: dict[str, list[float]] = defaultdict(list)
    for i in incidents:
        by_job[str(i.get("job"))].append(incident_time(i))
    resolved_idle, failed_resumed = [], []
    for i in incidents:
        t, steps = incident_time(i), steps_by_job.get(str(i.get("job")), [])
        row = {"incident": i["id"], "job": i.get("job"), "cause": i.get("cause"), "fault_at": t}
        if i.get("status") == "resolved" and stepped_again(steps, t, stop) is None:
            resolved_idle.append(row)
        if i.get("status") in ("failed", "stopped"):
            # before the job's next incident, which may be what made it step again
            until = min((x for x in by_job[str(i.get("job"))] if x > t), default=stop)
            done = stepped_again(steps, t, until)
            if done is not None:
                failed_resumed.append(
                    {**row, "status": i["status"], "stepped_again_after_s": rounded(done - t)}
                )
    return {
        "faults_without_incident": without,
        "faults_needing_no_incident": unseen,
        "shared_incidents": {faults[fi].key: iid for fi, iid in matches["shared"].items()},
        "extra_incidents": matches["extra"],
        "incidents_without_fault": matches["unexplained"],
        "resolved_without_step": resolved_idle,
        "failed_but_resumed": failed_resumed,
    }


def build_report(
    *,
    faults: Sequence[Fault],
    incidents: Sequence[dict[str, Any]],
    steps: Sequence[Step],
    commands: Sequence[Command],
    cordons: Sequence[Cordon],
    node_events: Sequence[NodeEvent],
    observations: Sequence[dict[str, Any]],
    start: float,
    stop: float,
    down_after_s: float = 15.0,
    match_window_s: float = 30.0,
    cordon_lookback_s: float = 120.0,
    host_window_s: float = 60.0,
) -> dict[str, Any]:
    """The report's sections over what happened from `start` to `stop` (when the bench
    began to stop the job: what followed is counted apart, not judged)."""
    faults = sorted((f for f in faults if f.ts <= stop), key=lambda f: f.ts)
    within = [i for i in incidents if incident_time(i) <= stop]
    cmds = [c for c in commands if c.issued_at <= stop]
    cords = [c for c in cordons if c.ts <= stop]
    steps = [s for s in steps if s.start <= stop]
    by_job = steps_by_job_name(steps)
    matches = match_faults(faults, within, match_window_s)
    recovery, observed = recovery_by_kind(
        faults, matches["incident_of"], {i["id"]: i for i in within}, by_job, stop
    )
    deaths = [f for f in faults if f.kind == "agent_death"]
    fault_rows = []
    for fi, f in enumerate(faults):
        iid = matches["incident_of"].get(fi) or matches["shared"].get(fi)
        inc = next((i for i in within if i["id"] == iid), None)
        fault_rows.append(
            {
                "fault": f.key,
                "kind": f.kind,
                "ts": f.ts,
                "job": f.job,
                "node": f.node,
                "rank": f.rank,
                "step": f.step,
                "down_s": rounded(f.down_s, 1),
                "agent_down": f.agent_down,
                "incident": iid,
                "shared": fi in matches["shared"],
                "incident_status": inc.get("status") if inc else None,
                "incident_level": inc.get("level") if inc else None,
                "api_recovery_s": rounded(inc.get("recovery_s")) if inc else None,
                "observed_recovery_s": observed[fi],
            }
        )
    vs = api_vs_processes(faults, matches, within, by_job, stop)
    accounted = {
        "injected": len(faults),
        "with_incident": len(matches["incident_of"]),
        "sharing_an_incident": len(matches["shared"]),
        "without_incident": len(vs["faults_without_incident"]),
        "needing_no_incident": len(vs["faults_needing_no_incident"]),
    }
    return {
        "window": {"start": start, "stop": stop, "minutes": rounded((stop - start) / 60, 2)},
        "faults": {
            "accounted": accounted,
            "by_kind": dict(Counter(f.kind for f in faults)),
            "list": fault_rows,
        },
        "incidents": incident_counts(within),
        "after_stop": {
            "incidents": len(incidents) - len(within),
            "commands": len(commands) - len(cmds),
            "cordons": len(cordons) - len(cords),
        },
        "wrongful": {
            "cordons": judge_cordons(cords, node_events, deaths, cordon_lookback_s),
            "commands": judge_commands(cmds, steps, node_events, host_window_s),
        },
        "recovery": recovery,
        "api_vs_processes": {
            **vs,
            "state": state_disagreements(
                [o for o in observations if o["ts"] <= stop], down_after_s
            ),
        },
        "invariants": invariants(within),
    }


def _stats(s: dict[str, Any]) -> str:
    return f"{s['p50']} / {s['p99']} (n={s['n']})" if s["n"] else "-"


def table(report: dict[str, Any]) -> str:
    """The report, readable: one block per section (the JSON has every row)."""
    f, inc = report["faults"], report["incidents"]
    acc, wr, vs = f["accounted"], report["wrongful"], report["api_vs_processes"]
    inv, state = report["invariants"], vs["state"]
    kinds = ", ".join(f"{k} {n}" for k, n in f["by_kind"].items()) or "none"
    lines = [
        f"trainguard bench chaos: {report['window']['minutes']} min (seed "
        f"{report['config']['seed']}), {len(report['runs'])} job run(s)"
        + (" - INTERRUPTED" if report["interrupted"] else ""),
        "",
        f"faults injected: {acc['injected']} ({kinds})",
        f"  with an incident {acc['with_incident']}, sharing one {acc['sharing_an_incident']}, "
        f"without {acc['without_incident']}, needing none {acc['needing_no_incident']}",
        f"incidents: {inc['total']} "
        f"({', '.join(f'{k} {n}' for k, n in inc['by_status'].items()) or 'none'}); "
        f"after the stop, not judged: {report['after_stop']['incidents']}",
    ]
    for status, outcomes in inc["by_outcome"].items():
        lines += [f"  {status}: {n} x {o}" for o, n in outcomes.items()]
    lines += [
        f"  by cause: {', '.join(f'{k} {n}' for k, n in inc['by_cause'].items()) or '-'}",
        "",
        f"wrongful cordons: {wr['cordons']['wrongful']} of {wr['cordons']['total']} engine cordons",
    ]
    lines += [
        f"  {c['node']} (incident {c['incident']}): {c['reason']}"
        for c in wr["cordons"]["wrongful_list"]
    ]
    lines.append(f"wrongful commands: {wr['commands']['wrongful']} of {wr['commands']['total']}")
    lines += [
        f"  {c['action']} to {c['node']} for {c['job']} (incident {c['incident']}), last report "
        f"{c['last_report_s_before']} s before"
        for c in wr["commands"]["wrongful_list"][:10]
    ]
    lines += [
        "",
        "| fault kind | faults | API recovery p50 / p99 (s) | observed p50 / p99 (s) |",
        "|---|---|---|---|",
    ]
    for kind, r in report["recovery"].items():
        lines.append(
            f"| {kind} | {r['faults']} | {_stats(r['api_recovery_s'])} "
            f"| {_stats(r['observed_recovery_s'])} |"
        )
    by_kind = ", ".join(f"{k} {n}" for k, n in state["by_kind"].items()) or "none"
    lines += [
        "",
        "the API against the processes:",
        f"  faults without an incident: {len(vs['faults_without_incident'])}"
        + "".join(
            f"\n    {x['fault']} ({x['kind']}, node {x['node']})"
            for x in vs["faults_without_incident"]
        ),
        f"  incidents without a fault: {len(vs['incidents_without_fault'])} "
        f"{vs['incidents_without_fault'][:20]}; "
        f"extra incidents of a fault: {len(vs['extra_incidents'])}",
        f"  resolved although the job made no step after: {len(vs['resolved_without_step'])} "
        f"{[x['incident'] for x in vs['resolved_without_step']]}",
        f"  failed or stopped although the job stepped again: {len(vs['failed_but_resumed'])} "
        f"{[x['incident'] for x in vs['failed_but_resumed']]}",
        f"  state disagreements over {state['observations']} observations: {by_kind}"
        + ("" if state["job_state_in_api"] else " (the API has no job state: not compared)"),
    ]
    lines += [
        f"    {e['kind']} {e['subject']} for {e['duration_s']} s: {e['detail']}"
        for e in state["episodes"][:10]
    ]
    if report.get("agent_exits"):
        lines.append(f"  agents that exited by themselves (started again): {report['agent_exits']}")
    lines += [
        "",
        f"invariants: {inv['checked']} incidents checked, {len(inv['violations'])} with a "
        f"violation, {len(inv['resolved_without_resumed_at'])} resolved without resumed_at",
    ]
    lines += [
        f"  incident {v['incident']}: {'; '.join(v['problems'])}" for v in inv["violations"][:20]
    ]
    return "\n".join(lines)
