"""`trainguard bench ingest`: sustained end-to-end ingest through a real backend process.

Load generators (separate processes, asyncio, keep-alive connections) play N nodes of G
simulated GPUs each, sampled every `period` (1 s = real time) and sent as one batch per node
every `batch_interval` (default: every sample; the backend's `agent_batch_interval_s`,
which real agents follow, is set to the same value), against one
`trainguard server` process on a loopback port. Reported: samples/s stored (counted in the
database, not just sent), ingest latency p50/p99, backend CPU and RSS, and on PostgreSQL the
raw limit (binary COPY of the same rows, no HTTP) measured in the same run for the ratio.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing as mp
import os
import random
import time
from pathlib import Path
from typing import Any

TOKEN = "bench-token-0123456789abcdef"


class _Conn:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams: the load generator must
    cost far less CPU than the server it measures (httpx's async client did not)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        await self.reader.readexactly(length)
        return int(status_line.split()[1])


def _gen_worker(
    url: str,
    nodes: list[str],
    gpus: int,
    period: float,
    batch_interval: float,
    duration: float,
    out: Any,
) -> None:
    from trainguard.protocol import wire

    host, port = url.removeprefix("http://").split(":")

    async def node_loop(
        node: str,
        lat: list[tuple[float, float]],
        first: list[float],
        err: list[int],
        slip: list[float],
    ) -> None:
        # One keep-alive connection per node, as a real agent holds one.
        conn = _Conn(host, int(port))
        agent_id = f"bench{random.getrandbits(40):010x}"
        uuids = [f"GPU-bench-{node}-{i}" for i in range(gpus)]
        inventory = [wire.GpuInfo(uuid=u, index=i) for i, u in enumerate(uuids)]
        seq = 0
        per_batch = max(1, round(batch_interval / period))  # samples per GPU per batch
        await asyncio.sleep(random.random() * batch_interval)
        end = time.monotonic() + duration
        nxt = time.monotonic()
        while time.monotonic() < end:
            seq += 1
            now = time.time()
            batch = wire.Batch(
                node=node,
                agent_id=agent_id,
                seq=seq,
                sent_at=now,
                simulated=True,
                gpus=inventory if seq == 1 else None,
                samples=[
                    wire.GpuSample(
                        uuid=u,
                        ts=now - k * period,
                        util=random.uniform(80, 100),
                        mem_util=40.0,
                        mem_used_mib=60000.0,
                        temp_c=random.uniform(55, 75),
                        power_w=650.0,
                        sm_clock_mhz=1980.0,
                        mem_clock_mhz=2619.0,
                        ecc_sbe_volatile=0,
                        ecc_dbe_volatile=0,
                        pcie_replay=0,
                    )
                    for k in range(per_batch - 1, -1, -1)
                    for u in uuids
                ],
            )
            body = wire.encode(batch)
            slip.append(time.monotonic() - nxt)  # how late this batch leaves its schedule
            t0 = time.perf_counter()
            status = 0
            # A kept connection the server closed while idle fails on first use: reconnect
            # once and resend, as an HTTP client's pool does.
            for attempt in range(2):
                reused = conn.writer is not None
                try:
                    status = await conn.post("/api/v1/ingest", body)
                    break
                except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                    conn.writer = None
                    if not reused or attempt:
                        break
            if status == 200:
                # An agent's first batch registers its node and GPUs: a one-time cost,
                # reported apart from the steady state.
                took = time.perf_counter() - t0
                if seq == 1:
                    first.append(took)
                else:
                    lat.append((time.time(), took))
            else:
                err.append(status)
            nxt += batch_interval
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))

    async def main() -> None:
        lat: list[tuple[float, float]] = []  # (when sent, epoch s; latency s)
        err: list[int] = []
        slip: list[float] = []
        first: list[float] = []
        await asyncio.gather(*(node_loop(n, lat, first, err, slip) for n in nodes))
        t = os.times()
        out.put(
            {
                "lat": lat,
                "first": first,
                "errors": len(err),
                "slip": slip,
                "cpu_s": t.user + t.system,
            }
        )

    asyncio.run(main())


def _rss_cpu(pid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return rss, cpu


def _ms(ordered: list[float], q: float) -> float | None:
    return round(1000 * ordered[int(q * (len(ordered) - 1))], 1) if ordered else None


def _by_window(sent_lat: list[tuple[float, float]], window: float) -> list[float | None]:
    if not sent_lat:
        return []
    start = sent_lat[0][0]
    windows: list[list[float]] = [[] for _ in range(int((sent_lat[-1][0] - start) // window) + 1)]
    for when, took in sent_lat:
        windows[int((when - start) // window)].append(took)
    return [_ms(sorted(w), 0.99) for w in windows]


def _machine_busy() -> float:
    """CPU seconds spent busy by the whole machine so far (/proc/stat, all cores)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _postgres_cpu() -> float:
    """CPU seconds of every local `postgres` process (a local server: the bench's)."""
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                head, _, rest = f.read().rpartition(")")
        except OSError:
            continue
        if head.endswith("(postgres"):
            fields = rest.split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _count(url: str, node_prefix: str = "") -> int:
    """Samples in the database; with `node_prefix`, only those of nodes named so."""
    from sqlalchemy import create_engine, func, select

    from trainguard.backend.models import Gpu, Node, Sample

    query = select(func.count()).select_from(Sample)
    if node_prefix:
        query = (
            query.join(Gpu, Gpu.id == Sample.gpu_id)
            .join(Node, Node.id == Gpu.node_id)
            .where(Node.name.startswith(node_prefix, autoescape=True))
        )
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(query).scalar_one())
    finally:
        engine.dispose()


def raw_copy_rate(url: str, rows: int = 200_000) -> float:
    """Binary COPY of sample-shaped rows straight into PostgreSQL, rows/s."""
    import psycopg
    from sqlalchemy.engine import make_url

    from trainguard.backend.ingest.writer import _PG_TYPES, SAMPLE_COLUMNS

    u = make_url(url)
    conninfo = u.set(drivername="postgresql").render_as_string(hide_password=False)
    data = [
        (
            1,
            time.time() + i,
            90.0,
            40.0,
            6e4,
            8e4,
            60.0,
            None,
            650.0,
            None,
            1980.0,
            2619.0,
            0,
            0,
            0,
            0,
            0,
            False,
            False,
            0,
        )
        for i in range(rows)
    ]
    with psycopg.connect(conninfo) as conn, conn.cursor() as cur:
        cur.execute("CREATE TEMP TABLE bench_raw (LIKE samples INCLUDING DEFAULTS)")
        t0 = time.perf_counter()
        with cur.copy(
            f"COPY bench_raw ({', '.join(SAMPLE_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
        ) as copy:
            copy.set_types(_PG_TYPES)
            for r in data:
                copy.write_row(r)
        conn.commit()
        return rows / (time.perf_counter() - t0)


def run(
    nodes: int,
    gpus: int,
    duration: float,
    period: float,
    workers: int,
    database_url: str | None,
    data_dir: Path,
    port: int,
    out_json: Path | None,
    batch_interval: float | None = None,
) -> dict[str, Any]:
    from trainguard.backend.bench.common import fresh_database
    from trainguard.backend.demo import start_server

    url = fresh_database(data_dir, database_url, "bench.db")
    before = _count(url)
    batch_interval = batch_interval or period
    env = {
        **os.environ,
        "TRAINGUARD_ADMIN_TOKEN": TOKEN,
        "TRAINGUARD_DATABASE_URL": url,
        "TRAINGUARD_AGENT_BATCH_INTERVAL_S": str(batch_interval),
        # Health marks a node degraded after half of this without a batch.
        "TRAINGUARD_NODE_DOWN_AFTER_S": str(max(15.0, 3 * batch_interval)),
    }
    server = start_server(port, env)
    base = f"http://127.0.0.1:{port}"
    try:
        names = [f"bench-{i:05d}" for i in range(nodes)]
        q: Any = mp.get_context("spawn").Queue()
        procs = [
            mp.get_context("spawn").Process(
                target=_gen_worker,
                args=(base, names[w::workers], gpus, period, batch_interval, duration, q),
            )
            for w in range(workers)
        ]
        _, cpu0 = _rss_cpu(server.pid)
        busy0, pg0 = _machine_busy(), _postgres_cpu()
        t0 = time.monotonic()
        for p in procs:
            p.start()
        results = [q.get() for _ in procs]
        for p in procs:
            p.join()
        elapsed = time.monotonic() - t0
        rss, cpu1 = _rss_cpu(server.pid)
        busy1, pg1 = _machine_busy(), _postgres_cpu()
    finally:
        server.terminate()
        server.wait(30)
    stored = _count(url) - before
    sent_lat = sorted((when, took) for r in results for when, took in r["lat"])
    lat = sorted(took for _, took in sent_lat)
    first = sorted(x for r in results for x in r["first"])
    slip = sorted(x for r in results for x in r["slip"])
    per_batch = max(1, round(batch_interval / period))
    sent_samples = len(slip) * per_batch * gpus
    report: dict[str, Any] = {
        "database": url.split(":", 1)[0],
        "nodes": nodes,
        "gpus_per_node": gpus,
        "offered_samples_per_s": nodes * gpus / period,
        "batch_interval_s": batch_interval,
        "offered_batches_per_s": round(nodes / batch_interval, 1),
        "duration_s": duration,
        "wall_s": round(elapsed, 1),
        "batches_sent": len(slip),
        "batches_ok": len(lat) + len(first),
        "stored_samples": stored,
        "stored_of_sent": round(stored / sent_samples, 4) if sent_samples else None,
        # Each node is due ceil(duration / batch_interval) batches of batch_interval
        # seconds of samples (staggered starts): stored over that span.
        "stored_samples_per_s": round(
            stored / (math.ceil(duration / batch_interval) * batch_interval)
        ),
        # How far behind its schedule the load generator sent (p99): when this grows,
        # the generator, not the backend, set the pace.
        "send_lag_p99_ms": _ms(slip, 0.99),
        "errors": sum(r["errors"] for r in results),
        # Steady state: every batch but each node's first (its registration).
        "latency_p50_ms": _ms(lat, 0.5),
        "latency_p99_ms": _ms(lat, 0.99),
        # The p99 of each 10 s of the run by send time: a tail that comes back at a
        # period (a timer, a full garbage collection) shows as a pattern here.
        "latency_p99_by_10s_ms": _by_window(sent_lat, 10.0),
        "first_batch_p50_ms": _ms(first, 0.5),
        "first_batch_p99_ms": _ms(first, 0.99),
        "backend_cpu_pct_of_core": round(100 * (cpu1 - cpu0) / elapsed, 1),
        "backend_rss_mib": round(rss, 1),
        # The same machine ran the load and the database: what they took, in cores.
        "load_generator_cpu_cores": round(sum(r["cpu_s"] for r in results) / elapsed, 2),
        "postgres_cpu_cores": round((pg1 - pg0) / elapsed, 2),
        "machine_busy_cores": round((busy1 - busy0) / elapsed, 2),
        "machine_cores": os.cpu_count(),
    }
    if url.startswith("postgresql"):
        raw = raw_copy_rate(url)
        report["raw_copy_rows_per_s"] = round(raw)
        report["ingest_over_raw"] = round(report["stored_samples_per_s"] / raw, 3)
    if out_json:
        out_json.write_text(json.dumps(report, indent=2))
    return report
