"""`trainguard bench soak`: is memory flat over a sustained ingest run?

One `trainguard server` process on a loopback port takes load for `minutes`: real
`trainguard agent --simulate` processes (their memory is what a GPU node pays) and, for
volume, the load generators of `trainguard bench ingest` playing many more nodes. The
resident set size (RSS) of the backend and of every agent is sampled every `every_s`;
the report gives it at the start (after a warm-up), in the middle and at the end, its
maximum, and its growth per hour fitted over the second half of the run (caches fill in
the first minutes; a leak is a growth that does not fade).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainguard.backend.bench.common import rss_cpu
from trainguard.backend.bench.ingest import (
    TOKEN,
    _count,
    _gen_worker,
    server_pids,
    wait_workers,
)


def _slope_per_h(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) points, in MiB per hour."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return 3600 * sum((t - mt) * (v - mv) for t, v in points) / var


def run(
    minutes: float = 10.0,
    nodes: int = 256,
    agents: int = 4,
    gpus: int = 8,
    period: float = 1.0,
    workers: int = 1,
    database_url: str | None = None,
    data_dir: Path = Path("data/soak"),
    port: int = 8316,
    every_s: float = 10.0,
    warmup_s: float = 60.0,
    json_out: Path | None = None,
    batch_interval: float | None = None,
    server_workers: int = 1,
) -> dict[str, Any]:
    """Load one backend for `minutes` with `agents` real agents and `nodes` generated nodes
    (`gpus` GPUs each, a batch every `period` s); report RSS of the backend and agents.

    The full RSS series goes to `json_out` (with the report); the returned dict holds the
    summary only, one value per key.
    """
    from trainguard.backend.bench.common import fresh_database
    from trainguard.backend.demo import wait_ready

    duration = minutes * 60
    batch_interval = batch_interval or period
    warmup_s = min(warmup_s, duration / 3)
    url = fresh_database(data_dir, database_url, "soak.db")
    before = _count(url)
    env = {
        **os.environ,
        "TRAINGUARD_ADMIN_TOKEN": TOKEN,
        "TRAINGUARD_DATABASE_URL": url,
        "TRAINGUARD_DATA_DIR": str(data_dir),
        # Generated nodes and real agents alike send a batch every batch_interval.
        "TRAINGUARD_AGENT_BATCH_INTERVAL_S": str(batch_interval if batch_interval > period else 0),
        "TRAINGUARD_NODE_DOWN_AFTER_S": str(max(15.0, 3 * batch_interval)),
        "TRAINGUARD_SERVER_WORKERS": str(server_workers),
    }
    cli = [sys.executable, "-m", "trainguard.agent.cli"]
    server = subprocess.Popen(
        [*cli, "server", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    spools = Path(tempfile.mkdtemp(prefix="tg-soak-"))
    agent_procs: list[subprocess.Popen[bytes]] = []
    gens: list[Any] = []
    series: list[dict[str, Any]] = []
    try:
        wait_ready(base, proc=server)
        wait_workers(base, server_workers)
        pids = server_pids(server.pid)
        for i in range(agents):
            node = f"soak-agent-{i:03d}"
            agent_env = {
                **env,
                "TRAINGUARD_AGENT_SPOOL_DIR": str(spools / node),
                "TRAINGUARD_AGENT_SOCKET_PATH": str(spools / f"{node}.sock"),
            }
            agent_procs.append(
                subprocess.Popen(
                    [
                        *cli,
                        "agent",
                        "--server",
                        base,
                        "--token",
                        TOKEN,
                        "--node",
                        node,
                        "--simulate",
                        str(gpus),
                        "--interval",
                        str(period),
                    ],
                    env=agent_env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        ctx = mp.get_context("spawn")
        q: Any = ctx.Queue()
        names = [f"soak-{i:05d}" for i in range(nodes)]
        gens = [
            ctx.Process(
                target=_gen_worker,
                args=(base, names[w::workers], gpus, period, batch_interval, duration, q),
            )
            for w in range(workers if nodes else 0)
        ]
        cpu0 = sum(rss_cpu(p)[1] for p in pids)
        t0 = time.monotonic()
        for g in gens:
            g.start()
        next_t = t0
        while (now := time.monotonic()) - t0 < duration:
            dead = [p.args for p in (server, *agent_procs) if p.poll() is not None]
            if dead:
                # Popen.args may be bytes to mypy; here a list, whose str() is its repr()
                raise RuntimeError(f"a soak process died: {dead[0]!r}")
            series.append(
                {
                    "t": round(now - t0, 1),
                    "backend_mib": round(sum(rss_cpu(p)[0] for p in pids), 1),
                    "agents_mib": [round(rss_cpu(a.pid)[0], 1) for a in agent_procs],
                }
            )
            next_t += every_s
            time.sleep(max(0.0, next_t - time.monotonic()))
        results = [q.get() for _ in gens]
        for g in gens:
            g.join()
        elapsed = time.monotonic() - t0
        cpu1 = sum(rss_cpu(p)[1] for p in pids)
    finally:
        for p in (*agent_procs, server):
            p.terminate()
        for p in (*agent_procs, server):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    stored = _count(url) - before
    warm = [s for s in series if s["t"] >= warmup_s] or series[-1:]
    first, last = warm[0], series[-1]
    mid = min(series, key=lambda s: abs(s["t"] - elapsed / 2))
    late = [s for s in warm if s["t"] >= elapsed / 2] or warm
    backend_fit = [(s["t"], s["backend_mib"]) for s in late]
    agent_fits = [[(s["t"], s["agents_mib"][i]) for s in late] for i in range(agents)]
    report: dict[str, Any] = {
        "database": url.split(":", 1)[0],
        "minutes": round(elapsed / 60, 2),
        "agents": agents,
        "generated_nodes": nodes,
        "gpus_per_node": gpus,
        "batch_interval_s": batch_interval,
        "server_workers": server_workers,
        "offered_samples_per_s": round((nodes + agents) * gpus / period),
        "stored_samples_per_s": round(stored / elapsed),
        "generator_errors": sum(r["errors"] for r in results),
        "warmup_s": warmup_s,
        "backend_cpu_pct_of_core": round(100 * (cpu1 - cpu0) / elapsed, 1),
        "backend_rss_mib_start": first["backend_mib"],
        "backend_rss_mib_mid": mid["backend_mib"],
        "backend_rss_mib_end": last["backend_mib"],
        "backend_rss_mib_max": max(s["backend_mib"] for s in series),
        "backend_rss_growth_mib_per_h": round(_slope_per_h(backend_fit), 1),
        # What the nodes cost: the RSS at the end over the server's before the load.
        "backend_rss_mib_idle": series[0]["backend_mib"],
        "backend_rss_mib_per_1000_nodes_end": round(
            1000 * (last["backend_mib"] - series[0]["backend_mib"]) / max(1, nodes + agents), 1
        ),
        "agent_rss_mib_start": max(first["agents_mib"], default=None),
        "agent_rss_mib_mid": max(mid["agents_mib"], default=None),
        "agent_rss_mib_end": max(last["agents_mib"], default=None),
        "agent_rss_mib_max": max((m for s in series for m in s["agents_mib"]), default=None),
        "agent_rss_growth_mib_per_h": round(max(map(_slope_per_h, agent_fits), default=0.0), 1),
    }
    if json_out:
        json_out.write_text(json.dumps({**report, "series": series}, indent=2))
    return report
