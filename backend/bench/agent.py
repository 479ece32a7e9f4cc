"""`trainguard bench agent`: what the node agent and the SDK cost a training node.

1. Agent CPU (% of one core) and RSS: a real `trainguard agent --simulate 8` at 1 Hz,
   posting to a real backend, while 8 rank processes report through the SDK at 10
   steps/s each (targets: < 1 % of a core, < 80 MB).
   With `pool` (default 2), the agent also runs its warm worker pool (agent/worker/):
   the pool process and its idle interpreters' CPU over the same window and their
   memory (RSS, and PSS, which splits what the forks share) are reported beside it.
2. SDK step-hook cost per step (`with tg.step(n): pass`), with an agent listening on the
   socket and with none (target: < 20 microseconds).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainguard.backend.bench.common import rss_cpu

TOKEN = "bench-token-0123456789abcdef"

_RANK = """
import os, time
from trainguard import sdk
flush = os.environ.get("BENCH_SDK_FLUSH_S")
tg = sdk.attach(**({"flush_interval": float(flush)} if flush else {}))
end = time.monotonic() + float(os.environ["BENCH_SECONDS"])
n = 0
while time.monotonic() < end:
    with tg.step(n):
        time.sleep(0.1)
    n += 1
tg.finished()
"""


def hook_cost_us(socket_path: str, steps: int = 50_000, repeats: int = 5) -> float:
    """Median over repeats of the mean cost of one empty step hook, in microseconds."""
    from trainguard import sdk

    os.environ.update(
        TRAINGUARD_AGENT_SOCKET=socket_path, RANK="0", WORLD_SIZE="1", TRAINGUARD_JOB="bench-hook"
    )
    tg = sdk.attach(socket_path=socket_path, heartbeat_interval=3600)  # no heartbeats in the timing
    try:
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for n in range(steps):
                with tg.step(n):
                    pass
            runs.append((time.perf_counter() - t0) / steps * 1e6)
        return statistics.median(runs)
    finally:
        tg.close()


def run(
    duration: float = 60.0,
    gpus: int = 8,
    ranks: int = 8,
    port: int = 8312,
    sdk_flush_s: float | None = None,
    pool: int = 2,
) -> dict[str, Any]:
    """`sdk_flush_s`: the ranks' SDK flush interval; None: the SDK's default. `pool`: the
    agent's warm worker pool size (0: none)."""
    from trainguard.backend.demo import start_server
    from trainguard.sdk import FLUSH_INTERVAL_S
    from trainguard.worker import pool_path_for
    from trainguard.worker.supervisor import query

    tmp = Path(tempfile.mkdtemp(prefix="tg-bench-agent-"))
    sock = str(tmp / "agent.sock")
    env = {**os.environ, "TRAINGUARD_ADMIN_TOKEN": TOKEN, "TRAINGUARD_DATA_DIR": str(tmp)}
    env.pop("TRAINGUARD_DATABASE_URL", None)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(start_server(port, env))
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainguard.agent.cli",
                "agent",
                "--server",
                f"http://127.0.0.1:{port}",
                "--token",
                TOKEN,
                "--node",
                "bench-node",
                "--simulate",
                str(gpus),
                *(("--pool", str(pool)) if pool else ()),
            ],
            env={
                **env,
                "TRAINGUARD_AGENT_SOCKET_PATH": sock,
                "TRAINGUARD_AGENT_SPOOL_DIR": str(tmp / "spool"),
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(agent)
        deadline = time.monotonic() + 30
        while not Path(sock).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        warmup = 5.0
        for r in range(ranks):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _RANK],
                    env={
                        **env,
                        "TRAINGUARD_AGENT_SOCKET": sock,
                        "RANK": str(r),
                        "LOCAL_RANK": str(r),
                        "WORLD_SIZE": str(ranks),
                        "TRAINGUARD_JOB": "bench-agent",
                        "BENCH_SECONDS": str(duration + warmup + 5),
                        "BENCH_SDK_FLUSH_S": "" if sdk_flush_s is None else str(sdk_flush_s),
                    },
                )
            )
        time.sleep(warmup)  # imports done, steady state reached
        pool0 = _pool_usage(pool_path_for(sock), query) if pool else None
        rss0, cpu0 = rss_cpu(agent.pid)
        t0 = time.monotonic()
        time.sleep(duration)
        rss1, cpu1 = rss_cpu(agent.pid)
        elapsed = time.monotonic() - t0
        pool1 = _pool_usage(pool_path_for(sock), query) if pool else None
        with_agent = hook_cost_us(sock)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait(30)
    without_agent = hook_cost_us(str(tmp / "nobody-listens.sock"))
    return {
        "gpus": gpus,
        "ranks": ranks,
        "rank_steps_per_s": ranks * 10,
        "sdk_flush_s": FLUSH_INTERVAL_S if sdk_flush_s is None else sdk_flush_s,
        "duration_s": round(elapsed, 1),
        "agent_cpu_pct_of_core": round(100 * (cpu1 - cpu0) / elapsed, 2),
        "agent_rss_mib_start": round(rss0, 1),
        "agent_rss_mib_end": round(rss1, 1),
        "sdk_step_hook_us_agent_listening": round(with_agent, 2),
        "sdk_step_hook_us_no_agent": round(without_agent, 2),
        "pool": _pool_report(pool, pool0, pool1, elapsed),
    }


def _pool_usage(path: str, query: Any) -> dict[str, Any] | None:
    """CPU seconds and memory of the pool process and its idle interpreters."""
    from trainguard.worker.supervisor import proc_cpu_s, proc_memory

    deadline = time.monotonic() + 60  # the pool imports torch first
    while (st := query(path)) is None or not st.get("idle"):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)
    pids = [int(st["pid"]), *map(int, st["idle"])]
    mem = [proc_memory(p) for p in pids]
    return {
        "pids": pids,
        "cpu_s": sum(c for p in pids if (c := proc_cpu_s(p)) is not None),
        "rss_mib": round(sum(m.get("rss", 0) for m in mem) / 2**20, 1),
        "pss_mib": round(sum(m.get("pss", 0) for m in mem) / 2**20, 1),
        "template_rss_mib": round(mem[0].get("rss", 0) / 2**20, 1),
    }


def _pool_report(
    size: int, start: dict[str, Any] | None, end: dict[str, Any] | None, elapsed: float
) -> dict[str, Any] | None:
    if not size:
        return None
    if start is None or end is None:
        return {"size": size, "error": "the pool did not come up (no torch?)"}
    return {
        "size": size,
        "idle_cpu_pct_of_core": round(100 * (end["cpu_s"] - start["cpu_s"]) / elapsed, 3),
        "same_processes": start["pids"] == end["pids"],
        "rss_mib": end["rss_mib"],
        "pss_mib": end["pss_mib"],
        "template_rss_mib": end["template_rss_mib"],
    }
