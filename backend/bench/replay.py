"""`trainguard bench replay`: how long the policy replay (backend/replay) takes over a
period of N incidents, and its memory.

The trace is synthesized in the trace format (backend/replay/trace.py), from a seed: J
jobs of 2 nodes x 2 ranks (ft_launcher, under NVRx's Wrapper); each node's agent sends
a batch every BATCH_S with one step per rank; each job meets a fault every `gap_s`
(jittered): an exception or an XID 13 (in_process), a hang (in_process), or a rank's
death (launcher; its launcher starts a new generation 3 s later). The record holds no
decision: the replay's commands are acked by the ack model's default delays
(backend/replay/ackmodel.py), and the self-check is not what is measured. The policy is
the default with the limits opened (BENCH_POLICY): every fault is its own incident,
none climbs to stop_job.

Reported: the incidents the replay opened, the engine cycles it ran, wall time,
incidents/s, and the process's peak RSS.
"""

from __future__ import annotations

import random
import resource
import time
from typing import Any

BATCH_S = 5.0  # a node's batch interval (at most node_down_after_s / 3)
T0 = 1_800_000_000.0
BENCH_POLICY = """\
# trainguard bench replay: the default policy, no limit reached by the synthetic faults
[limits]
cooldown_s = 0
budget_per_hour = 100000
[escalation]
in_process = 1000
launcher = 1000
exclude_node = 1000
"""
KINDS = ("exception", "xid", "hang", "rank_exit")


def synthesize(incidents: int, jobs: int, gap_s: float, seed: int) -> Any:
    """A trace of `jobs` jobs meeting `incidents` faults in all, one every `gap_s` each."""
    from trainguard.backend.replay.trace import Trace

    rng = random.Random(seed)
    per_job = -(-incidents // jobs)
    length = 60.0 + per_job * gap_s + 60.0
    tr = Trace(since=T0, until=T0 + length, exported_at=T0 + length)
    eid = 0

    def event(
        node: str, kind: str, ts: float, job: str | None, rank: int | None, **kw: Any
    ) -> None:
        nonlocal eid
        eid += 1
        tr["event"].append(
            {
                "id": eid,
                "node": node,
                "ts": ts,
                "received_at": ts + 0.05,
                "kind": kind,
                "gpu_uuid": kw.pop("gpu_uuid", None),
                "job": job,
                "rank": rank,
                "xid": kw.pop("xid", None),
                "message": kw.pop("message", kind),
                "data": kw,
            }
        )

    left = incidents
    for j in range(jobs):
        name, nodes = f"job-{j}", [f"node-{2 * j}", f"node-{2 * j + 1}"]
        tr["job"].append(
            {"name": name, "first_seen": T0, "world_size": 4, "display_name": None}
            | {"attempt": 0, "iteration": 0}
        )
        for node_name in nodes:
            tr["node"].append(
                {"name": node_name, "simulated": True, "first_seen": T0, "clock_offset_s": 0}
            )
            tr["gpu"].append({"node": node_name, "uuid": f"GPU-{node_name}", "index": 0})
        faults = sorted(
            T0 + 60.0 + k * gap_s + rng.uniform(0, gap_s / 2) for k in range(min(per_job, left))
        )
        left -= len(faults)
        pid, attempt, iteration = 1000 * (j + 1), 0, 0
        for r in range(4):
            tr["rank"].append(
                {
                    "job": name,
                    "rank": r,
                    "node": nodes[r // 2],
                    "local_rank": r % 2,
                    "pid": pid + r,
                    "attempt": 0,
                    "iteration": 0,
                    "in_process": True,
                    "launcher": "ft_launcher",
                    "max_restarts": 100000,
                    "restart_count": 0,
                }
            )
        step, t, fi = 0, T0 + rng.uniform(0, BATCH_S), 0
        while t < tr.until:
            while fi < len(faults) and faults[fi] <= t:
                f, fi = faults[fi], fi + 1
                kind = rng.choice(KINDS)
                rank = rng.randrange(1, 4)
                node = nodes[rank // 2]
                if kind == "xid":
                    event(node, "xid", f, None, None, xid=13, gpu_uuid=f"GPU-{node}")
                elif kind == "rank_exit":
                    event(node, "rank_exit", f, name, rank, pid=pid + rank, exit_code=1)
                    pid, attempt, iteration = pid + 10, attempt + 1, 0
                    for r in range(4):
                        data = {"pid": pid + r, "attempt": attempt, "iteration": 0}
                        event(nodes[r // 2], "rank_start", f + 3.0, name, r, **data)
                    continue
                else:
                    event(node, kind, f, name, rank, message=f"bench {kind}")
                iteration += 1
            for n, node in enumerate(nodes):
                tr["batch"].append({"node": node, "received_at": t + 0.01 * n})
                for r in (2 * n, 2 * n + 1):
                    tr["step"].append(
                        {
                            "job": name,
                            "node": node,
                            "rank": r,
                            "step": step,
                            "start": t - 1.0,
                            "end": t - 0.01,
                            "attempt": attempt,
                            "iteration": iteration,
                            "compute_s": 0.9,
                        }
                    )
            step += 1
            t += BATCH_S
    tr["event"].sort(key=lambda e: (e["received_at"], e["id"]))
    for n, e in enumerate(tr["event"], 1):
        e["id"] = n
    tr["batch"].sort(key=lambda b: b["received_at"])
    return tr


def run(incidents: int, jobs: int, gap_s: float, seed: int, sweep_s: float = 0.5) -> dict:
    from trainguard.backend.engine.policy import load_policy_text
    from trainguard.backend.replay import run as replay_run

    started = time.perf_counter()
    tr = synthesize(incidents, jobs, gap_s, seed)
    made_s = time.perf_counter() - started
    policy = load_policy_text(BENCH_POLICY, "bench")
    started = time.perf_counter()
    out = replay_run.replay(tr, policy, fresh_within_s=15.0, sweep_s=sweep_s)
    wall = time.perf_counter() - started
    opened = len(out.incidents)
    return {
        "faults": incidents,
        "jobs": jobs,
        "period_h": round((tr.until - tr.since) / 3600, 2),
        "events": len(tr["event"]),
        "batches": len(tr["batch"]),
        "steps": len(tr["step"]),
        "synthesized_s": round(made_s, 2),
        "incidents_replayed": opened,
        "by_level": _levels(out.incidents),
        "cycles": out.cycles,
        "acks": out.acks,
        "wall_s": round(wall, 2),
        "incidents_per_s": round(opened / wall, 1) if wall else None,
        "ms_per_cycle": round(1000 * wall / out.cycles, 2) if out.cycles else None,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "goal_under_60_s": wall < 60.0 if incidents >= 10_000 else None,
    }


def _levels(incidents: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in incidents:
        out[i["level"]] = out.get(i["level"], 0) + 1
    return dict(sorted(out.items()))
