"""`trainguard bench decision`: time from a fault's evidence reaching the backend to the
command it calls for being acknowledged (`delivered`) by a real agent.

One `trainguard server` process and one `trainguard agent --simulate 2` process on
loopback. A reporter plays a second agent on the same node: every `interval` seconds it
posts one ingest batch with a new job's rank and that rank's `exception` event (open
loop: it does not wait for the previous decision). The engine decides `in_process`, the
command row wakes the agent's long-poll, the agent acks `delivered`. Per event:

- arrival: the backend's receive time of the batch (incident `detected_at`);
- decided: the engine's decision (`decided_at`);
- delivered: the agent's `delivered` ack (`delivered_at`, the agent's clock: the same
  machine's clock here).

The policy is opened up so every event is its own decision (no cooldown, no budget, no
escalation). The agent has no rank of these jobs, so after `delivered` it acks `failed`;
that is outside what is measured.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

TOKEN = "bench-token-0123456789abcdef"
NODE = "bench-decision-node"
LOAD_NODE_PREFIX = "load-"  # the ingest load's nodes (not a prefix of NODE)
POLICY = """
[limits]
cooldown_s = 0
budget_per_hour = 100000
[escalation]
in_process = 1000
launcher = 1000
exclude_node = 1000
on_failed = false
"""


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(1000 * s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))], 1)


def _summary(values: list[float]) -> dict[str, float | None]:
    return {
        "p50_ms": _pct(values, 0.5),
        "p99_ms": _pct(values, 0.99),
        "max_ms": round(1000 * max(values), 1) if values else None,
        "mean_ms": round(1000 * statistics.fmean(values), 1) if values else None,
    }


def _check_load(load: list[Any], when: str) -> None:
    """The ingest load must run for the whole measurement, or the figures are not what
    the report says they are."""
    dead = [p.exitcode for p in load if not p.is_alive()]
    if dead:
        raise RuntimeError(
            f"{len(dead)} of {len(load)} ingest load generators exited {when} "
            f"(exit codes {dead}); no result"
        )


def run(
    events: int = 200,
    interval: float = 0.1,
    database_url: str | None = None,
    data_dir: Path = Path("data/bench-decision"),
    port: int = 8312,
    out_json: Path | None = None,
    load_nodes: int = 0,
    load_batch_interval: float = 4.0,
) -> dict[str, Any]:
    """Run the benchmark; returns (and writes to `out_json`) the report. With `load_nodes`,
    `bench ingest`'s load generators (2 processes) play that many 8-GPU nodes batching
    every `load_batch_interval` s against the same server for the whole run."""
    import multiprocessing as mp

    import httpx

    from trainguard.backend.bench.common import fresh_database
    from trainguard.backend.bench.ingest import _count, _gen_worker
    from trainguard.backend.demo import start_server
    from trainguard.protocol import wire

    data_dir = data_dir.resolve()
    url = fresh_database(data_dir, database_url, "bench.db")
    policy = data_dir / "policy.toml"
    policy.write_text(POLICY)
    run_id = uuid.uuid4().hex[:8]
    env = {
        **os.environ,
        "TRAINGUARD_ADMIN_TOKEN": TOKEN,
        "TRAINGUARD_DATABASE_URL": url,
        "TRAINGUARD_POLICY_FILE": str(policy),
        "TRAINGUARD_NODE_DOWN_AFTER_S": "3600",
        "TRAINGUARD_AGENT_BATCH_INTERVAL_S": str(load_batch_interval),
    }
    base = f"http://127.0.0.1:{port}"
    logs = (data_dir / "server.log").open("wb"), (data_dir / "agent.log").open("wb")
    server = start_server(port, env, stdout=logs[0])
    agent: subprocess.Popen[bytes] | None = None
    headers = {"Authorization": f"Bearer {TOKEN}"}
    sent: dict[str, float] = {}
    http = httpx.Client(base_url=base, headers=headers, timeout=30)
    load: list[Any] = []
    try:
        if load_nodes:
            ctx = mp.get_context("spawn")
            names = [f"{LOAD_NODE_PREFIX}{i:05d}" for i in range(load_nodes)]
            span = events * interval + 60.0  # warm-up and collection included
            # Held here for the workers' lifetime: Process.start() drops its args, and a
            # queue collected before a spawned child unpickles it fails that child
            # (FileNotFoundError on the queue's semaphore): a run without its load.
            load_queues = [ctx.Queue() for _ in range(2)]
            load = [
                ctx.Process(
                    target=_gen_worker,
                    args=(base, names[w::2], 8, 1.0, load_batch_interval, span, q),
                    daemon=True,
                )
                for w, q in enumerate(load_queues)
            ]
            for p in load:
                p.start()
            time.sleep(load_batch_interval + 2)  # every node registered, steady state
            _check_load(load, "before the events")
        agent = subprocess.Popen(
            [
                *(sys.executable, "-m", "trainguard.agent.cli", "agent", "--server", base),
                *("--token", TOKEN, "--node", NODE, "--simulate", "2", "--interval", "1"),
            ],
            env={
                **env,
                "TRAINGUARD_AGENT_SPOOL_DIR": str(data_dir / f"spool-{run_id}"),
                "TRAINGUARD_AGENT_SOCKET_PATH": str(data_dir / f"agent-{run_id}.sock"),
            },
            stdout=logs[1],
            stderr=subprocess.STDOUT,
        )
        seq = 0

        def report(job: str) -> float:
            nonlocal seq
            seq += 1
            now = time.time()
            batch = wire.Batch(
                node=NODE,
                agent_id=f"reporter-{run_id}",
                seq=seq,
                sent_at=now,
                ranks=[wire.RankStatus(job=job, rank=0, pid=4_000_000 + seq)],
                events=[
                    wire.Event(kind="exception", ts=now, job=job, rank=0, message="bench fault")
                ],
            )
            r = http.post("/api/v1/ingest", content=wire.encode(batch))
            r.raise_for_status()
            return now

        def delivered(job: str, timeout: float) -> dict[str, Any] | None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                incs = http.get("/api/v1/incidents", params={"job": job}).json()
                if incs and incs[0]["timeline"]["delivered_at"] is not None:
                    return dict(incs[0])
                time.sleep(0.05)
            return None

        # Warm up: the agent is connected and polling, every path is imported.
        for i in range(3):
            report(f"bd-{run_id}-warm{i}")
            if delivered(f"bd-{run_id}-warm{i}", 60) is None:
                raise RuntimeError(f"no delivery during warm-up; see {data_dir}/*.log")
        t0 = time.monotonic()
        nxt = t0
        for i in range(events):
            job = f"bd-{run_id}-{i:04d}"
            sent[job] = report(job)
            nxt += interval
            time.sleep(max(0.0, nxt - time.monotonic()))
        send_s = time.monotonic() - t0
        deadline = time.monotonic() + 60
        incidents: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline and len(incidents) < events:
            for inc in http.get("/api/v1/incidents", params={"limit": 1000}).json():
                if inc["job"] in sent and inc["timeline"]["delivered_at"] is not None:
                    incidents[inc["job"]] = inc
            if len(incidents) < events:
                time.sleep(0.2)
        engine = http.get("/api/v1/engine").json()
        _check_load(load, "during the events")
    finally:
        http.close()
        for p in load:
            p.terminate()
        for p in (agent, server):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
        for f in logs:
            f.close()
    load_samples = _count(url, LOAD_NODE_PREFIX) if load_nodes else 0
    arrival_delivered, arrival_decided, decided_delivered, sent_delivered = [], [], [], []
    for job, inc in incidents.items():
        t = inc["timeline"]
        arrival_delivered.append(t["delivered_at"] - t["detected_at"])
        arrival_decided.append(t["decided_at"] - t["detected_at"])
        decided_delivered.append(t["delivered_at"] - t["decided_at"])
        sent_delivered.append(t["delivered_at"] - sent[job])
    result: dict[str, Any] = {
        "database": url.split(":", 1)[0],
        "events": events,
        "interval_s": interval,
        "ingest_load": (
            f"{load_nodes} nodes x 8 GPUs, a batch every {load_batch_interval:g} s"
            if load_nodes
            else "none"
        ),
        # What the load stored, counted in the database: the load really ran.
        "ingest_load_samples_stored": load_samples,
        "offered_events_per_s": round(events / send_s, 1),
        "delivered": len(incidents),
        "missing": events - len(incidents),
        "arrival_to_delivered": _summary(arrival_delivered),
        "arrival_to_decided": _summary(arrival_decided),
        "decided_to_delivered": _summary(decided_delivered),
        "sent_to_delivered": _summary(sent_delivered),
        "engine_errors": engine.get("errors"),
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if out_json:
        out_json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":  # pragma: no cover - `trainguard bench decision` is the entry
    rep = run(events=int(sys.argv[1]) if len(sys.argv) > 1 else 200)
    print(json.dumps(rep, indent=2))
