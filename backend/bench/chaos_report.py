"""The report of `trainguard bench chaos` (pure functions over the rows of
backend/bench/chaos_checks.py and chaos_states.py; the runner is backend/bench/chaos.py,
the reading guide docs/benchmarks-chaos.md): incidents by status and outcome, wrongful
actions, false states, recovery per fault kind, the API against the processes, and the
incidents' invariants.

The API against the processes: faults with no incident, incidents with no fault (or for a
fault that must have none), incidents resolved although the job made no step after their
fault, incidents failed or stopped although the job stepped again, and the state the API
showed (node up or down, `agent_down` for an agent stopped gracefully, live ranks and
their pids) against the processes the bench saw, as episodes that lasted longer than their
grace. The job's state against its launchers is a false state (chaos_states.py).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from trainguard.backend.bench.chaos_checks import (
    NO_INCIDENT_KINDS,
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
from trainguard.backend.bench.chaos_states import (
    budget_answers,
    cordoned_while_stepping,
    goodput_after_end,
    job_state_vs_launcher,
    open_after_end,
)

# seconds a disagreement must last before it counts (the API learns of a process within
# about a second; a new worker's first heartbeat follows its torch import)
STARTUP_S = 30.0  # a worker younger than this may not have said hello to its agent yet
GRACE_S = {
    "node_up_agent_dead": 10.0,
    "node_down_agent_alive": 10.0,
    "agent_stop_not_agent_down": 10.0,
    "ranks": 20.0,
}


def _disagreements(obs: dict[str, Any], down_after_s: float) -> list[tuple[str, str, str]]:
    """(kind, subject, detail) of every disagreement in one observation."""
    ts = float(obs["ts"])
    out = []
    for name, n in (obs.get("nodes") or {}).items():
        status, last_seen = n.get("api_status"), n.get("api_last_seen")
        silent = last_seen is not None and ts - float(last_seen) > down_after_s
        api_down = status in ("down", "agent_down") or (status == "cordoned" and silent)
        since = ts - float(n.get("agent_since") or ts)
        if not n.get("agent_alive"):
            if since > down_after_s and not api_down and status is not None:
                out.append(("node_up_agent_dead", name, f"agent dead {since:.0f} s, API {status}"))
            elif (
                n.get("agent_down") == "agent_stop"
                and since > down_after_s
                and status not in ("agent_down", "cordoned", None)
            ):
                # its agent said goodbye: the node reads agent_down (a cordon is judged
                # apart: a wrongful cordon, a node cordoned while its ranks step)
                out.append(
                    (
                        "agent_stop_not_agent_down",
                        name,
                        f"agent stopped gracefully {since:.0f} s ago, API {status}",
                    )
                )
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
    """Faults without incident, incidents without fault (or for a fault that must have
    none), and incidents whose status the job's steps contradict."""
    without: list[dict[str, Any]] = []
    unseen: list[dict[str, Any]] = []
    undue: list[dict[str, Any]] = []
    for fi, f in enumerate(faults):
        row = {"fault": f.key, "kind": f.kind, "ts": f.ts, "node": f.node, "rank": f.rank}
        iid = matches["incident_of"].get(fi) or matches["shared"].get(fi)
        if f.kind in NO_INCIDENT_KINDS:
            # an agent's graceful stop, the user's own SIGTERM: no fault of the job's
            (unseen if iid is None else undue).append({**row, "incident": iid})
            continue
        if iid is not None:
            continue
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
        "incidents_where_none_is_due": undue,
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
    runs: Sequence[dict[str, Any]] = (),
    posts: Sequence[dict[str, Any]] = (),
    read_at: float | None = None,
    relaunch_wait_s: float = 120.0,
) -> dict[str, Any]:
    """The report's sections over what happened from `start` to `stop` (when the bench
    began to stop the job: what followed is counted apart, not judged). `runs` are the
    job runs (job, ended_at, end, goodput_reads), `posts` the operator's restart requests
    (chaos_outside.py), `read_at` when the incidents were read (default: `stop`)."""
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
    due = [fi for fi, f in enumerate(faults) if f.kind not in NO_INCIDENT_KINDS]
    accounted = {
        "injected": len(faults),
        "with_incident": sum(1 for fi in due if fi in matches["incident_of"]),
        "sharing_an_incident": sum(1 for fi in due if fi in matches["shared"]),
        "without_incident": len(vs["faults_without_incident"]),
        "needing_no_incident": len(vs["faults_needing_no_incident"]),
        "with_an_undue_incident": len(vs["incidents_where_none_is_due"]),
    }
    seen = [o for o in observations if o["ts"] <= stop]
    false_states = {
        "cordoned_while_stepping": cordoned_while_stepping(cords, steps, seen),
        "job_state_vs_launcher": job_state_vs_launcher(seen, steps, relaunch_wait_s),
        "open_incident_after_end": open_after_end(
            runs, incidents, stop, stop if read_at is None else read_at, relaunch_wait_s + 30.0
        ),
        "goodput_after_end": goodput_after_end(runs, stop),
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
            "budget_answers": budget_answers([p for p in posts if p["at"] <= stop], STARTUP_S),
        },
        "false_states": {
            "total": sum(x["count"] for x in false_states.values()),
            **false_states,
        },
        "recovery": recovery,
        "api_vs_processes": {
            **vs,
            "state": state_disagreements(seen, down_after_s),
        },
        "invariants": invariants(within),
    }


def _stats(s: dict[str, Any]) -> str:
    return f"{s['p50']} / {s['p99']} (n={s['n']})" if s["n"] else "-"


def _false_state_lines(fs: dict[str, Any]) -> list[str]:
    cw, js = fs["cordoned_while_stepping"], fs["job_state_vs_launcher"]
    oa, ga = fs["open_incident_after_end"], fs["goodput_after_end"]
    lines = [
        f"false states: {fs['total']}",
        f"  nodes cordoned while their ranks step: {cw['count']} of {cw['judged']} cordons judged",
    ]
    lines += [
        f"    {x['node']} ({x['job']}): the same workers stepped {x['alive_after_s']} s after "
        f"the cordon: {x['reason']}"
        for x in cw["list"][:10]
    ]
    lines.append(
        f"  job states their launchers contradict: {js['count']} "
        f"({', '.join(f'{k} {n}' for k, n in js['by_kind'].items()) or 'none'}); "
        f"given up (stopped) while training, not counted: {len(js['given_up'])}"
    )
    lines += [
        f"    {x['kind']} {x['job']} for {x['duration_s']} s: {x['detail']}"
        for x in js["list"][:10]
    ]
    lines.append(
        f"  incidents left open for a job that ended: {oa['count']} "
        f"({oa['jobs_judged']} ended jobs judged)"
    )
    lines += [
        f"    incident {x['incident']} ({x['job']}, {x['status']}, {x['cause']}): job ended "
        f"{x['job_ended_s_before']} s before"
        for x in oa["list"][:10]
    ]
    lines.append(
        f"    held exclusions left as questions about their node, not counted: "
        f"{len(oa.get('node_questions', []))}"
    )
    lines.append(
        f"  goodput that moved after the job's end: {ga['count']} of {ga['jobs_judged']} ended "
        f"jobs read twice" + (f" (not read twice: {ga['unread']})" if ga["unread"] else "")
    )
    lines += [f"    {x['job']} in {x['apart_s']} s: {x['moved']}" for x in ga["list"][:10]]
    return lines


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
        f"without {acc['without_incident']}, needing none {acc['needing_no_incident']}, "
        f"with an incident although none is due {acc['with_an_undue_incident']}",
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
    ba = wr["budget_answers"]
    lines.append(
        f"wrong answers to the operator's launcher restarts: {ba['wrong']} of {ba['judged']} "
        f"judged ({ba['posts']} posted: "
        f"{', '.join(f'{k} {n}' for k, n in ba['answers'].items()) or 'none'})"
    )
    lines += [
        f"  {x['job']}: {x['wrong']} (the workers had {x['restarts_left']} left, the API said "
        f"{x['api_restarts_left']})"
        for x in ba["wrong_list"][:10]
    ]
    lines += ["", *_false_state_lines(report["false_states"])]
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
        f"  incidents for a fault that must have none: "
        f"{len(vs['incidents_where_none_is_due'])}"
        + "".join(
            f"\n    {x['fault']} ({x['kind']}): incident {x['incident']}"
            for x in vs["incidents_where_none_is_due"][:10]
        ),
        f"  state disagreements over {state['observations']} observations: {by_kind}",
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
