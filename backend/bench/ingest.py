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

from trainguard.backend.bench.common import rss_cpu

TOKEN = "bench-token-0123456789abcdef"


class _Conn:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams: the load generator must
    cost far less CPU than the server it measures (httpx's async client did not)."""

    def __init__(self, host: str, port: int, content_type: str = "application/json") -> None:
        self.host, self.port, self.content_type = host, port, content_type
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, float]:
        """The answer's status, and its Retry-After in seconds (0 when none)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: {self.content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        await self.writer.drain()
        # The answer's head in one read, not a read per header line.
        answer = (await self.reader.readuntil(b"\r\n\r\n")).lower()
        at = answer.find(b"\r\ncontent-length:")
        length = int(answer[at + 17 : answer.index(b"\r\n", at + 2)]) if at >= 0 else 0
        await self.reader.readexactly(length)
        at = answer.find(b"\r\nretry-after:")
        retry_after = float(answer[at + 14 : answer.index(b"\r\n", at + 2)]) if at >= 0 else 0.0
        return int(answer.split(None, 2)[1]), retry_after


def node_phases(count: int, interval: float) -> list[float]:
    """Each of `count` nodes' offset in the batch interval, spread evenly at random: node
    i's is uniform in the i-th of `count` equal slices of the interval, so any stretch of
    the interval holds its share of the nodes' batches (independent uniform offsets leave
    clumps and gaps of a few percent at 16,384 nodes)."""
    return [(i + random.random()) * interval / count for i in range(count)]


def _gen_worker(
    url: str,
    nodes: list[str],
    gpus: int,
    period: float,
    batch_interval: float,
    duration: float,
    out: Any,
    encoding: str = "json",
    ramp: float = 0.0,
) -> None:
    from trainguard.protocol import wire

    encode = wire.encode_msgpack if encoding == "msgpack" else wire.encode
    content_type = wire.MSGPACK_TYPE if encoding == "msgpack" else wire.JSON_TYPE

    host, port = url.removeprefix("http://").split(":")
    # The nodes start over `spread` seconds; every node sends from its start to
    # `duration` after it, so all of them do in [spread, duration] after the start.
    spread = max(ramp, batch_interval)

    async def post(conn: _Conn, body: bytes) -> tuple[int, float]:
        # A kept connection the server closed while idle fails on first use: reconnect
        # once and resend, as an HTTP client's pool does.
        for attempt in range(2):
            reused = conn.writer is not None
            try:
                return await conn.post("/api/v1/ingest", body)
            except (
                OSError,
                asyncio.IncompleteReadError,
                asyncio.LimitOverrunError,
                ValueError,
                IndexError,
            ):
                conn.writer = None
                if not reused or attempt:
                    break
        return 0, 0.0

    async def node_loop(
        node: str,
        due: float,
        lat: list[tuple[float, float]],
        first: list[float],
        err: list[int],
        slip: list[float],
        steady: list[float],
        all_on: tuple[float, float],  # the monotonic span when every node is sending
        answers_503: list[int],  # per batch, how many 503 answers it got before the last
    ) -> None:
        # One keep-alive connection per node, as a real agent holds one.
        conn = _Conn(host, int(port), content_type)
        agent_id = f"bench{random.getrandbits(40):010x}"
        uuids = [f"GPU-bench-{node}-{i}" for i in range(gpus)]
        inventory = [wire.GpuInfo(uuid=u, index=i) for i, u in enumerate(uuids)]
        per_batch = max(1, round(batch_interval / period))  # samples per GPU per batch
        # The node's batches are due at its planned phase and every batch_interval after
        # it, not from whenever this coroutine first woke: woken late by a busy loop (a
        # start-up of thousands of nodes), the nodes' phases bunched, and the server got
        # 1,000 to 3,000 batches a second in waves of the interval for 2,048 offered.
        nxt = due
        end = nxt + duration
        await asyncio.sleep(max(0.0, nxt - time.monotonic()))
        # The node's samples are built once and refreshed in place for each batch: the
        # generator shares the machine with what it measures (42 -> 30 µs a batch).
        samples = [
            wire.GpuSample(
                uuid=u,
                ts=0.0,
                util=90.0,
                mem_util=40.0,
                mem_used_mib=60000.0,
                temp_c=65.0,
                power_w=650.0,
                sm_clock_mhz=1980.0,
                mem_clock_mhz=2619.0,
                ecc_sbe_volatile=0,
                ecc_dbe_volatile=0,
                pcie_replay=0,
            )
            for _ in range(per_batch)
            for u in uuids
        ]
        rand = random.random
        seq = 0
        # A batch goes if it was due before the end and the end has not passed: a batch
        # behind schedule at the end is not sent (the run measures what the server kept
        # up with), and a timer that fires a little early (uvloop's) adds none.
        while nxt < end and time.monotonic() < end:
            seq += 1
            now = time.time()
            for i, sample in enumerate(samples):  # oldest first, as an agent's outbox
                sample.ts = now - (per_batch - 1 - i // gpus) * period
                sample.util = 80.0 + 20.0 * rand()
                sample.temp_c = 55.0 + 20.0 * rand()
            batch = wire.Batch(
                node=node,
                agent_id=agent_id,
                seq=seq,
                sent_at=now,
                simulated=True,
                gpus=inventory if seq == 1 else None,
                samples=samples,
            )
            body = encode(batch)
            slip.append(time.monotonic() - nxt)  # how late this batch leaves its schedule
            t0 = time.perf_counter()
            refusals = 0
            while True:
                status, retry_after = await post(conn, body)
                # 503 (the database unavailable, a proxy's overload): sent again after
                # Retry-After and the agent's jitter (agent/uplink.py), until one interval
                # past the end. Latency is from the first send to the answer that stored it.
                if status != 503 or time.monotonic() + retry_after > end + batch_interval:
                    break
                backoff = min(30.0, 0.5 * 2**refusals)
                refusals += 1
                await asyncio.sleep(retry_after + random.uniform(0, backoff))
            answers_503.append(refusals)
            if status == 200:
                # An agent's first batch registers its node and GPUs: a one-time cost,
                # reported apart from the steady state.
                took = time.perf_counter() - t0
                if seq == 1:
                    first.append(took)
                else:
                    lat.append((time.time(), took))
                    if all_on[0] <= nxt < all_on[1]:
                        steady.append(took)
            else:
                err.append(status)
            nxt += batch_interval
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))

    async def main() -> None:
        lat: list[tuple[float, float]] = []  # (when answered, epoch s; latency s)
        err: list[int] = []
        slip: list[float] = []
        first: list[float] = []
        steady: list[float] = []
        answers_503: list[int] = []
        t0 = time.monotonic()
        all_on = (t0 + spread, t0 + duration)
        due = [t0 + ph for ph in node_phases(len(nodes), spread)]
        await asyncio.gather(
            *(
                node_loop(n, d, lat, first, err, slip, steady, all_on, answers_503)
                for n, d in zip(nodes, due, strict=True)
            )
        )
        t = os.times()
        out.put(
            {
                "lat": lat,
                "first": first,
                "errors": len(err),
                "slip": slip,
                "steady": steady,
                "answers_503": sum(answers_503),
                "sent_again": sum(1 for n in answers_503 if n),
                "cpu_s": t.user + t.system,
            }
        )

    # The generator shares the machine with what it measures: uvloop (uvicorn[standard]
    # installs it, the server runs on it) where present. The asyncio default loop's
    # selector and transport were a third of the generator's CPU (py-spy).
    try:
        import uvloop
    except ImportError:  # not on this platform: the default loop
        asyncio.run(main())
    else:
        uvloop.run(main())


def server_pids(pid: int) -> list[int]:
    """The server's processes: itself, and with `--workers` its worker processes (its
    children, less multiprocessing's resource tracker)."""
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        return pids
    for child in children:
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if b"resource_tracker" in f.read():
                    continue
        except OSError:
            continue
        pids.append(child)
    return pids


def wait_workers(base: str, workers: int, timeout: float = 120.0) -> None:
    """With several server processes: until each has answered /readyz (new connections
    land on each worker's socket in turn), so no worker is still starting when the load
    begins."""
    from urllib.request import urlopen

    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while workers > 1 and len(seen) < workers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only workers {sorted(seen)} of {workers} answered")
        try:
            with urlopen(f"{base}/readyz", timeout=2) as resp:
                seen.add(resp.headers.get("x-trainguard-worker", ""))
        except OSError:
            time.sleep(0.2)


def _ms(ordered: list[float], q: float) -> float | None:
    return round(1000 * ordered[int(q * (len(ordered) - 1))], 1) if ordered else None


def merged_timings(
    results: list[dict[str, Any]],
) -> tuple[list[tuple[float, float]], list[float], list[float], list[float]]:
    """The generator processes' timings, merged and sorted: (send time, latency) of every
    batch but each node's first, those latencies alone, the first batches' latencies,
    and how late each batch left its schedule."""
    sent_lat = sorted((when, took) for r in results for when, took in r["lat"])
    lat = sorted(took for _, took in sent_lat)
    first = sorted(x for r in results for x in r["first"])
    slip = sorted(x for r in results for x in r["slip"])
    return sent_lat, lat, first, slip


def generator_cpu(results: list[dict[str, Any]], elapsed: float) -> dict[str, Any]:
    """The load generators' CPU over the run, in cores: all of them, and each process's."""
    return {
        "load_generator_cpu_cores": round(sum(r["cpu_s"] for r in results) / elapsed, 2),
        "load_generator_cpu_cores_by_process": [round(r["cpu_s"] / elapsed, 2) for r in results],
    }


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


def _tcp_drops() -> dict[str, int]:
    """The kernel's counts of connections a full accept queue dropped and of SYNs sent
    again (/proc/net/netstat, the whole machine: on loopback, the bench's own). A dropped
    connect is retried after 1, 3, 7, 15, 31 s: a registration burst's tail."""
    counts: dict[str, int] = {}
    try:
        with open("/proc/net/netstat") as f:
            lines = f.read().splitlines()
    except OSError:
        return counts
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        for name, value in zip(names.split()[1:], values.split()[1:], strict=False):
            if name in ("ListenOverflows", "TCPSynRetrans"):
                counts[name] = int(value)
    return counts


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


def postgres_state(url: str) -> dict[str, Any]:
    """PostgreSQL's write-side settings and counters, read before and after a run: the
    buffer cache and WAL sizes it runs with, checkpoints so far (timed and requested)
    and the WAL position. After each checkpoint, the first change to a page puts the whole
    page in the WAL: too small a `max_wal_size` makes checkpoints follow each other by
    seconds, and the WAL per stored sample shows it (with the samples indexed by
    (gpu_id, ts), before migration 0011, every GPU's own index leaf page each time).
    {} on SQLite."""
    if not url.startswith("postgresql"):
        return {}
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            setting = "SELECT current_setting(:name)"
            state: dict[str, Any] = {
                name: conn.execute(text(setting), {"name": name}).scalar_one()
                for name in ("shared_buffers", "max_wal_size", "checkpoint_timeout")
            }
            # PostgreSQL 17 moved the checkpoint counters to pg_stat_checkpointer.
            new = conn.execute(
                text("SELECT to_regclass('pg_catalog.pg_stat_checkpointer') IS NOT NULL")
            ).scalar_one()
            counters = (
                "SELECT num_timed + num_requested FROM pg_stat_checkpointer"
                if new
                else "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
            )
            state["checkpoints"] = int(conn.execute(text(counters)).scalar_one())
            state["wal_bytes"] = int(
                conn.execute(text("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")).scalar_one()
            )
            return state
    finally:
        engine.dispose()


def postgres_report(before: dict[str, Any], after: dict[str, Any], stored: int) -> dict[str, Any]:
    """What a run's report says of PostgreSQL from two `postgres_state` readings."""
    if not after:
        return {}
    return {
        "postgres_shared_buffers": after["shared_buffers"],
        "postgres_max_wal_size": after["max_wal_size"],
        "postgres_checkpoint_timeout": after["checkpoint_timeout"],
        "postgres_checkpoints": after["checkpoints"] - before["checkpoints"],
        "postgres_wal_bytes_per_sample": (
            round((after["wal_bytes"] - before["wal_bytes"]) / stored) if stored else None
        ),
    }


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


def raw_copy_rate(url: str, rows: int = 200_000, into_samples: bool = False) -> float:
    """Binary COPY of sample-shaped rows straight into PostgreSQL, rows/s, from one
    connection: into a temporary table without indexes (the wire's ceiling), or with
    `into_samples` into the `samples` table itself, with its indexes and foreign key,
    rolled back (the ceiling of one ingest writer, whose COPY goes there)."""
    import psycopg
    from sqlalchemy.engine import make_url

    from trainguard.backend.ingest.writer import _PG_TYPES, SAMPLE_COLUMNS

    u = make_url(url)
    conninfo = u.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo) as conn:
        gpu_ids = [r[0] for r in conn.execute("SELECT id FROM gpus ORDER BY id LIMIT 200000")]
    gpu_ids = gpu_ids or [1]
    data = [
        (
            gpu_ids[i % len(gpu_ids)],
            time.time() + i // len(gpu_ids),
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
    if into_samples and len(gpu_ids) == 1 and gpu_ids[0] == 1:
        return 0.0  # no GPU rows: nothing the foreign key would accept
    with psycopg.connect(conninfo) as conn, conn.cursor() as cur:
        table = "samples"
        if not into_samples:
            table = "bench_raw"
            cur.execute("CREATE TEMP TABLE bench_raw (LIKE samples INCLUDING DEFAULTS)")
        t0 = time.perf_counter()
        with cur.copy(
            f"COPY {table} ({', '.join(SAMPLE_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
        ) as copy:
            copy.set_types(_PG_TYPES)
            for r in data:
                copy.write_row(r)
        if into_samples:  # the foreign key's checks ran at the end of the COPY
            took = time.perf_counter() - t0
            conn.rollback()
            return rows / took
        conn.commit()
        return rows / (time.perf_counter() - t0)


def _warnings(log: Path) -> int:
    """Lines at WARNING or above in the server's log (its text format: the level after
    the time, as backend/logs.py writes it)."""
    levels = (" WARNING ", " ERROR ", " CRITICAL ")
    with log.open(errors="replace") as f:
        return sum(1 for line in f if any(level in line for level in levels))


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
    server_workers: int = 1,
    encoding: str = "json",
    ramp: float = 0.0,
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
        "TRAINGUARD_SERVER_WORKERS": str(server_workers),
    }
    # The server's log is kept: a warning in it (a failed group, a reconnect) explains
    # a run's tail latency.
    log_path = data_dir / "server.log"
    log_file = log_path.open("wb")
    server = start_server(port, env, stdout=log_file)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_workers(base, server_workers)
        pids = server_pids(server.pid)
        names = [f"bench-{i:05d}" for i in range(nodes)]
        q: Any = mp.get_context("spawn").Queue()
        procs = [
            mp.get_context("spawn").Process(
                target=_gen_worker,
                args=(
                    base,
                    names[w::workers],
                    gpus,
                    period,
                    batch_interval,
                    duration,
                    q,
                    encoding,
                    ramp,
                ),
            )
            for w in range(workers)
        ]
        rss_cpu0 = [rss_cpu(p) for p in pids]
        cpu0 = [c for _, c in rss_cpu0]
        pgs0 = postgres_state(url)
        busy0, pg0, tcp0 = _machine_busy(), _postgres_cpu(), _tcp_drops()
        t0 = time.monotonic()
        for p in procs:
            p.start()
        results = [q.get() for _ in procs]
        for p in procs:
            p.join()
        elapsed = time.monotonic() - t0
        rss_cpu1 = [rss_cpu(p) for p in pids]
        busy1, pg1, tcp1 = _machine_busy(), _postgres_cpu(), _tcp_drops()
        pgs1 = postgres_state(url)
    finally:
        server.terminate()
        server.wait(30)
        log_file.close()
    stored = _count(url) - before
    sent_lat, lat, first, slip = merged_timings(results)
    steady = sorted(x for r in results for x in r["steady"])
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
        # Answers of 503, and the batches that got one: each was sent again after
        # Retry-After (as an agent does) and counts once above.
        "answers_503": sum(r["answers_503"] for r in results),
        "batches_sent_again": sum(r["sent_again"] for r in results),
        # Steady state: every batch but each node's first (its registration).
        "latency_p50_ms": _ms(lat, 0.5),
        "latency_p99_ms": _ms(lat, 0.99),
        # The p99 of each 10 s of the run by answer time: a tail that comes back at a
        # period (a timer, a full garbage collection) shows as a pattern here.
        "latency_p99_by_10s_ms": _by_window(sent_lat, 10.0),
        # With --ramp: the nodes start over that many seconds (at least one interval),
        # and these are the batches due while every node was sending (ramp to duration).
        "ramp_s": max(ramp, batch_interval),
        "batches_all_nodes": len(steady),
        "latency_p50_all_nodes_ms": _ms(steady, 0.5),
        "latency_p99_all_nodes_ms": _ms(steady, 0.99),
        "first_batch_p50_ms": _ms(first, 0.5),
        "first_batch_p99_ms": _ms(first, 0.99),
        "server_workers": server_workers,
        "encoding": encoding,
        # Connects the server's full accept queue dropped, and the SYNs sent again.
        "listen_overflows": tcp1.get("ListenOverflows", 0) - tcp0.get("ListenOverflows", 0),
        "syn_retransmits": tcp1.get("TCPSynRetrans", 0) - tcp0.get("TCPSynRetrans", 0),
        "server_log": str(log_path),
        "server_log_warnings": _warnings(log_path),
        # The whole server (supervisor and workers), then each of its processes.
        "backend_cpu_pct_of_core": round(
            100 * sum(c1 - c0 for (_, c1), c0 in zip(rss_cpu1, cpu0, strict=True)) / elapsed, 1
        ),
        "backend_cpu_pct_by_process": [
            round(100 * (c1 - c0) / elapsed, 1) for (_, c1), c0 in zip(rss_cpu1, cpu0, strict=True)
        ],
        # The total is the sum of the figures listed per process, so the two agree.
        "backend_rss_mib": round(sum(round(r, 1) for r, _ in rss_cpu1), 1),
        "backend_rss_mib_by_process": [round(r, 1) for r, _ in rss_cpu1],
        # What the nodes cost: the RSS at the end over the idle server's before the load.
        "backend_rss_mib_idle": round(sum(r for r, _ in rss_cpu0), 1),
        "backend_rss_mib_per_1000_nodes": round(
            1000 * (sum(r for r, _ in rss_cpu1) - sum(r for r, _ in rss_cpu0)) / nodes, 1
        ),
        # The same machine ran the load and the database: what they took, in cores.
        **generator_cpu(results, elapsed),
        "postgres_cpu_cores": round((pg1 - pg0) / elapsed, 2),
        **postgres_report(pgs0, pgs1, stored),
        "machine_busy_cores": round((busy1 - busy0) / elapsed, 2),
        "machine_cores": os.cpu_count(),
    }
    if url.startswith("postgresql"):
        raw = raw_copy_rate(url)
        report["raw_copy_rows_per_s"] = round(raw)
        report["ingest_over_raw"] = round(report["stored_samples_per_s"] / raw, 3)
        # What one writer's COPY can reach: the real table, its indexes and foreign key.
        report["raw_copy_into_samples_rows_per_s"] = round(raw_copy_rate(url, into_samples=True))
    if out_json:
        out_json.write_text(json.dumps(report, indent=2))
    return report
