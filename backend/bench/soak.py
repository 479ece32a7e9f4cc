"""`trainguard bench soak`: is memory flat over a sustained ingest run?

One `trainguard server` process on a loopback port takes load for `minutes`: real
`trainguard agent --simulate` processes (their memory is what a GPU node pays) and, for
volume, the load generators of `trainguard bench ingest` playing many more nodes. The
resident set size (RSS) of the backend and of every agent is sampled every `every_s`;
the report gives it at the start (after a warm-up), in the middle and at the end, its
maximum, and its growth per hour fitted over the second half of the run (caches fill in
the first minutes; a leak is a growth that does not fade). RSS is also the backlog (a
batch in flight holds its samples), so the report gives what was stored of what the
generators sent and the generators' latency minute by minute: a memory that grows with a
latency that grows is a backlog, not a leak. On PostgreSQL it adds the checkpoints and
the WAL written per sample during the run (`ingest.postgres_state`).
"""

from __future__ import annotations

import json
import math
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
    _by_window,
    _count,
    _gen_worker,
    _machine_busy,
    _ms,
    _postgres_cpu,
    _warnings,
    generator_cpu,
    merged_timings,
    postgres_report,
    postgres_state,
    server_pids,
    wait_workers,
)

# The generated nodes' names: their samples are counted apart from the real agents'.
GENERATED = "soakgen-"


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
    encoding: str = "json",
) -> dict[str, Any]:
    """Load one backend for `minutes` with `agents` real agents and `nodes` generated nodes
    (`gpus` GPUs each, a batch every `period` s); report RSS of the backend and agents.

    The full RSS series goes to `json_out` (with the report); the returned dict holds the
    summary only, one value per key.
    """
    from trainguard.backend.bench.common import fresh_database
    from trainguard.backend.demo import start_server

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
    # The server's log is kept (as `bench ingest` keeps it): a warning explains a tail.
    log_path = data_dir / "server.log"
    log_file = log_path.open("wb")
    server = start_server(port, env, stdout=log_file)
    base = f"http://127.0.0.1:{port}"
    spools = Path(tempfile.mkdtemp(prefix="tg-soak-"))
    agent_procs: list[subprocess.Popen[bytes]] = []
    gens: list[Any] = []
    series: list[dict[str, Any]] = []
    try:
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
        names = [f"{GENERATED}{i:05d}" for i in range(nodes)]
        gens = [
            ctx.Process(
                target=_gen_worker,
                args=(base, names[w::workers], gpus, period, batch_interval, duration, q, encoding),
            )
            for w in range(workers if nodes else 0)
        ]
        cpu0 = sum(rss_cpu(p)[1] for p in pids)
        pgs0 = postgres_state(url)
        busy0, pg0 = _machine_busy(), _postgres_cpu()
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
        busy1, pg1 = _machine_busy(), _postgres_cpu()
        pgs1 = postgres_state(url)
    finally:
        for p in (*agent_procs, server):
            p.terminate()
        for p in (*agent_procs, server):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        log_file.close()
    stored = _count(url) - before
    # Without agents every stored sample is a generated one: no second count (a join
    # over every sample: 78 M rows after ten minutes at 131,072 GPUs).
    generated = _count(url, GENERATED) if agents else stored
    sent_lat, lat, first_batches, slip = merged_timings(results)
    sent = len(slip) * max(1, round(batch_interval / period)) * gpus
    # The span the samples were offered over, as `bench ingest` counts it: each node is
    # due ceil(duration / batch_interval) batches. The elapsed time also holds the
    # generators' start and the last answers.
    span = math.ceil(duration / batch_interval) * batch_interval
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
        "encoding": encoding,
        "offered_samples_per_s": round((nodes + agents) * gpus / period),
        "stored_samples_per_s": round(stored / span),
        # Of the generators' samples sent, those stored (a batch behind its schedule at
        # the end is not sent: what falls short of the offer shows in the rate above).
        "generated_stored_of_sent": round(generated / sent, 4) if sent else None,
        "generator_errors": sum(r["errors"] for r in results),
        "send_lag_p99_ms": _ms(slip, 0.99),
        # Every generated batch but each node's first (its registration), as in ingest.
        "latency_p50_ms": _ms(lat, 0.5),
        "latency_p99_ms": _ms(lat, 0.99),
        "latency_p99_by_minute_ms": _by_window(sent_lat, 60.0),
        # Finer, to set beside PostgreSQL's checkpoints or the host's own log: the windows
        # start at the first steady batch's send time (epoch seconds).
        "latency_p99_by_10s_ms": _by_window(sent_lat, 10.0),
        "latency_windows_start_epoch_s": round(sent_lat[0][0], 1) if sent_lat else None,
        "first_batch_p99_ms": _ms(first_batches, 0.99),
        "server_log_warnings": _warnings(log_path),
        "warmup_s": warmup_s,
        "backend_cpu_pct_of_core": round(100 * (cpu1 - cpu0) / elapsed, 1),
        **generator_cpu(results, elapsed),
        "postgres_cpu_cores": round((pg1 - pg0) / elapsed, 2),
        **postgres_report(pgs0, pgs1, stored),
        "machine_busy_cores": round((busy1 - busy0) / elapsed, 2),
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
