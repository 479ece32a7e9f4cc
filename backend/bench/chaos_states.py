"""The false states `trainguard bench chaos` counts (pure functions over its rows; the
report is backend/bench/chaos_report.py, the reading guide docs/benchmarks-chaos.md). Each
is something the API said that the processes the bench started contradict, checked
against those processes (their pids and ages from /proc, their exits, the steps their
ranks reported):

1. `cordoned_while_stepping`: a node cordoned while its ranks step: a worker of the
   node's launcher alive at the cordon is still alive, the same process (pid and age),
   `grace_s` after it, and its rank reported steps from that node past the grace: no
   exclusion's launcher restart took it away;
2. `job_state_vs_launcher`: the API says the job ended (an `ended_at`, or `finished` /
   `failed`) while a launcher of it lives and its ranks step, for `grace_s`; or it does not
   say so after its launchers all exited, for longer than `grace_s` past what the backend
   can know: a clean exit, an end by a signal from outside and an end after stop_job (the
   API said `stopped`) at once, any other end only when no new generation came within the
   policy's `relaunch_wait_s`, and all of them only from when every agent of the job was
   up again (the exits of ranks whose agent was down are lost: those ends count as
   "any other"); or it names the wrong end (`finished` for a launcher that failed, another
   state for launchers that all exited 0, judged where every agent saw the end). `stopped`
   with no `ended_at` while the job trains is "trainguard stopped acting; the launcher
   still restarts it" (docs/engine.md), listed apart, not counted;
3. `open_after_end`: an incident `open` or `pending` when the report is read, of a job
   whose launchers all exited (before the bench's stop) at least `grace_s` earlier; a
   held exclusion the engine turned into a question about the node only (its last
   decision `node_only`: approving it cordons the node and restarts nothing) is listed
   apart, not counted;
4. `goodput_after_end`: a job's goodput (GET /jobs/{job}/goodput) that changed between
   two reads some seconds apart after the job ended.

And the operator's restarts against the launcher's budget (`budget_answers`): a 409
`restart_budget` while the launchers' workers had more than one restart left, or a 202
without `force` while they had one or none (docs/engine.md, "The launcher's restart
budget"), judged only where the workers' budget was the same before and after the post
and every worker was past its start-up (the backend had heard of it).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from trainguard.backend.bench.chaos_checks import Cordon, Step, rounded

LAST_LAUNCHER_RESTART = 1  # incidents.service.LAST_LAUNCHER_RESTART (the backend's rule)
SIGNAL_ENDS = ("user SIGTERM", "stalled")  # runs ended by a signal from outside the job
OPEN_STATUSES = frozenset({"open", "pending"})
STEP_WINDOW_S = 10.0  # a job "steps" at t when a rank of it began a step within this before t


def _workers(obs: dict[str, Any], node: str) -> dict[tuple[int, int], float]:
    """{(rank, pid): age} of the node's training processes in one observation."""
    n = (obs.get("nodes") or {}).get(node) or {}
    return {(int(r), int(p)): float(age) for r, p, age in n.get("proc_ranks") or []}


def cordoned_while_stepping(
    cordons: Sequence[Cordon],
    steps: Sequence[Step],
    observations: Sequence[dict[str, Any]],
    grace_s: float = 30.0,
    look_s: float = 10.0,
) -> dict[str, Any]:
    """False state 1 (module docstring). A cordon is judged when an observation lies
    within `look_s` before it and one within `look_s` after its grace."""
    obs = sorted(observations, key=lambda o: o["ts"])
    times = [o["ts"] for o in obs]
    rows, unjudged = [], 0
    for c in sorted(cordons, key=lambda c: c.ts):
        i = bisect.bisect_right(times, c.ts)
        after = [o for o in obs[i:] if c.ts + grace_s <= o["ts"] <= c.ts + grace_s + 3 * look_s]
        if (
            i == 0
            or c.ts - times[i - 1] > look_s
            or not after
            or after[0]["ts"] > c.ts + grace_s + look_s
        ):
            unjudged += 1
            continue
        before = obs[i - 1]
        at = _workers(before, c.node)
        # the same processes (pid, and an age grown with the clock) past the grace
        last, survivors = None, set()
        for o in after:
            now = _workers(o, c.node)
            same = {
                k
                for k, age in at.items()
                if k in now and abs(now[k] - age - (o["ts"] - before["ts"])) <= 5.0
            }
            if not same:
                break
            last, survivors = o, same
        if last is None:
            continue
        ranks = {r for r, _pid in survivors}
        stepped = [
            s
            for s in steps
            if s.node == c.node
            and s.job == before.get("job")
            and s.rank in ranks
            and c.ts + grace_s <= s.start <= last["ts"]
        ]
        if stepped:
            rows.append(
                {
                    "ts": c.ts,
                    "node": c.node,
                    "actor": c.actor,
                    "reason": c.reason[:200],
                    "job": before.get("job"),
                    "alive_after_s": rounded(last["ts"] - c.ts, 1),
                    "same_processes": sorted(survivors),
                    "steps_after_grace": len(stepped),
                }
            )
    return {"judged": len(cordons) - unjudged, "count": len(rows), "list": rows}


def _stepping(starts: list[float], ts: float) -> bool:
    i = bisect.bisect_right(starts, ts)
    return i > 0 and starts[i - 1] >= ts - STEP_WINDOW_S


def job_state_vs_launcher(
    observations: Sequence[dict[str, Any]],
    steps: Sequence[Step],
    relaunch_wait_s: float,
    grace_s: float = 30.0,
) -> dict[str, Any]:
    """False state 2 (module docstring), as episodes of consecutive observations."""
    starts: dict[str, list[float]] = defaultdict(list)
    for s in steps:
        starts[s.job].append(s.start)
    for v in starts.values():
        v.sort()
    open_: dict[tuple[str, str], dict[str, Any]] = {}
    episodes: list[dict[str, Any]] = []
    stopped: dict[str, bool] = {}  # the API said stopped (stop_job) while the launchers ran
    for obs in sorted(observations, key=lambda o: o["ts"]):
        ts, now = float(obs["ts"]), {}
        for job, j in (obs.get("jobs") or {}).items():
            state = j.get("api_state")
            if state is None:
                continue
            claims_end = j.get("api_ended_at") is not None or state in ("finished", "failed")
            training = int(j.get("launchers_alive") or 0) > 0 and _stepping(starts[job], ts)
            exited = bool(j.get("ended")) and not j.get("launchers_alive")
            if claims_end and training:
                now[("ended_while_training", job)] = f"launchers alive and stepping, API {state}"
            elif training and state == "stopped":
                now[("given_up_while_training", job)] = "stopped with no ended_at: given up"
            if not exited:
                stopped[job] = state == "stopped"
                continue
            seen_at = j.get("end_seen_at", j.get("ended_at"))
            if seen_at is None:
                continue  # an agent of it is still down: the backend cannot know yet
            signal = str(j.get("end") or "").startswith(SIGNAL_ENDS)
            seen = float(seen_at) <= float(j.get("ended_at") or seen_at)
            known = seen and (bool(j.get("exit_ok")) or signal or stopped.get(job, False))
            late = ts - float(seen_at) - (0.0 if known else relaunch_wait_s)
            if not claims_end and late > grace_s:
                now[("active_after_exit", job)] = f"launchers exited ({j.get('end')}), API {state}"
            if claims_end and seen:
                if j.get("exit_ok") and state != "finished":
                    now[("wrong_end", job)] = f"launchers all exited 0, API {state}"
                elif not j.get("exit_ok") and not signal and state == "finished":
                    now[("wrong_end", job)] = "a launcher failed, API finished"
        for key in list(open_):
            if key not in now:
                episodes.append(open_.pop(key))
        for (kind, job), detail in now.items():
            ep = open_.setdefault(
                (kind, job), {"kind": kind, "job": job, "from": ts, "detail": detail}
            )
            ep["to"] = ts
    episodes += open_.values()
    false, given_up = [], []
    for ep in sorted(episodes, key=lambda e: e["from"]):
        ep["duration_s"] = rounded(ep["to"] - ep["from"], 1)
        if ep["kind"] == "given_up_while_training":
            given_up.append(ep)
        elif ep["kind"] == "active_after_exit" or ep["to"] - ep["from"] >= grace_s:
            false.append(ep)  # active_after_exit already waited out its grace
    by_kind: dict[str, int] = defaultdict(int)
    for ep in false:
        by_kind[ep["kind"]] += 1
    return {"count": len(false), "by_kind": dict(by_kind), "list": false, "given_up": given_up}


def open_after_end(
    runs: Sequence[dict[str, Any]],
    incidents: Sequence[dict[str, Any]],
    stop: float,
    read_at: float,
    grace_s: float,
) -> dict[str, Any]:
    """False state 3 (module docstring): over the runs that ended before the stop."""
    ended = {
        r["job"]: r
        for r in runs
        if r.get("ended_at") is not None
        and r["ended_at"] <= stop
        and read_at - r["ended_at"] >= grace_s
    }
    rows: list[dict[str, Any]] = []
    node_questions: list[dict[str, Any]] = []
    for i in incidents:
        if i.get("job") not in ended or i.get("status") not in OPEN_STATUSES:
            continue
        row = {
            "incident": i["id"],
            "job": i.get("job"),
            "status": i.get("status"),
            "cause": i.get("cause"),
            "outcome": str(i.get("outcome") or "")[:200],
            "job_ended_s_before": rounded(read_at - ended[str(i.get("job"))]["ended_at"], 1),
        }
        # A held exclusion whose job ended stays as a question about the node only
        # (approving it cordons the node, nothing more: engine/lifecycle.py, NODE_ONLY).
        (node_questions if _node_only(i) else rows).append(row)
    return {
        "jobs_judged": len(ended),
        "count": len(rows),
        "list": rows,
        "node_questions": node_questions,
    }


def _node_only(inc: dict[str, Any]) -> bool:
    decisions = inc.get("decisions") or []
    return bool(decisions) and decisions[-1].get("mode") == "node_only"


GOODPUT_KEYS = ("goodput", "elapsed_s", "productive_s", "until")


def goodput_after_end(runs: Sequence[dict[str, Any]], stop: float) -> dict[str, Any]:
    """False state 4 (module docstring): each run that ended before the stop, read twice."""
    rows, unread = [], []
    for r in runs:
        if r.get("ended_at") is None or r["ended_at"] > stop:
            continue
        reads = r.get("goodput_reads") or []
        if len(reads) < 2:
            unread.append(r["job"])
            continue
        a, b = reads[0], reads[-1]
        moved = {
            k: [a.get(k), b.get(k)]
            for k in GOODPUT_KEYS
            if (a.get(k) is None) != (b.get(k) is None)
            or (a.get(k) is not None and abs(float(a[k]) - float(b[k])) > 1e-6)
        }
        if moved:
            rows.append(
                {
                    "job": r["job"],
                    "apart_s": rounded(b["at"] - a["at"], 1),
                    "api_ended_at": [a.get("api_ended_at"), b.get("api_ended_at")],
                    "moved": moved,
                }
            )
    judged = sum(1 for r in runs if r.get("ended_at") is not None and r["ended_at"] <= stop)
    return {"jobs_judged": judged - len(unread), "count": len(rows), "list": rows, "unread": unread}


def budget_answers(posts: Sequence[dict[str, Any]], startup_s: float) -> dict[str, Any]:
    """The operator's launcher restarts against the workers' budget (module docstring)."""
    wrong, unjudged = [], 0
    answered: dict[str, int] = defaultdict(int)
    for p in posts:
        refused = p.get("code") == 409 and p.get("body_code") == "restart_budget"
        answered[
            "forced"
            if p.get("force") and p.get("code") == 202
            else "accepted"
            if p.get("code") == 202
            else "refused for the budget"
            if refused
            else f"other ({p.get('code')})"
        ] += 1
        a, b = p.get("proc_before"), p.get("proc_after")
        if (
            p.get("force")
            or p.get("code") not in (202, 409)
            or (p.get("code") == 409 and not refused)
            or not a
            or not b
            or a["restarts_left"] != b["restarts_left"]
            or min(a["youngest_s"], b["youngest_s"]) < startup_s
        ):
            unjudged += 1
            continue
        last = a["restarts_left"] <= LAST_LAUNCHER_RESTART
        if refused != last:
            wrong.append(
                {
                    "job": p.get("job"),
                    "at": p.get("at"),
                    "code": p.get("code"),
                    "restarts_left": a["restarts_left"],
                    "api_restarts_left": p.get("api_restarts_left"),
                    "wrong": "refused with restarts to spare" if refused else "used the last one",
                    "detail": p.get("detail"),
                }
            )
    return {
        "posts": len(posts),
        "answers": dict(answered),
        "judged": len(posts) - unjudged,
        "wrong": len(wrong),
        "wrong_list": wrong,
    }
