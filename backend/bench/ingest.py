"""`trainguard bench ingest`: sustained end-to-end ingest through a real backend process.

Load generators (separate processes, one epoll loop each, keep-alive connections) play N
nodes of G simulated GPUs each, sampled every `period` (1 s = real time) and sent as one
batch per node every `batch_interval` (default: every sample; the backend's
`agent_batch_interval_s`, which real agents follow, is set to the same value), against one
`trainguard server` process on a loopback port. Reported: samples/s stored (counted in the
database, not just sent), ingest latency p50/p99, backend CPU and RSS, and on PostgreSQL the
raw limit (binary COPY of the same rows, no HTTP) measured in the same run for the ratio.
"""

from __future__ import annotations

import errno
import heapq
import json
import math
import multiprocessing as mp
import os
import random
import select
import socket
import time
from pathlib import Path
from typing import Any

from trainguard.backend.bench.common import busy_sample, rss_cpu

TOKEN = "bench-token-0123456789abcdef"


def node_phases(count: int, interval: float) -> list[float]:
    """Each of `count` nodes' offset in the batch interval, spread evenly at random: node
    i's is uniform in the i-th of `count` equal slices of the interval, so any stretch of
    the interval holds its share of the nodes' batches (independent uniform offsets leave
    clumps and gaps of a few percent at 16,384 nodes)."""
    return [(i + random.random()) * interval / count for i in range(count)]


class _Node:
    """One simulated node of a generator process: its schedule, its batch and its
    keep-alive connection (as a real agent holds one)."""

    __slots__ = (
        "agent_id",
        "answer",
        "body",
        "busy",
        "end",
        "fresh",
        "inventory",
        "name",
        "nxt",
        "out",
        "ranks",
        "refusals",
        "resend",
        "retried",
        "samples",
        "seq",
        "sock",
        "t0",
    )

    def __init__(self, name: str, gpus: int, per_batch: int, ranks: int = 0) -> None:
        from trainguard.protocol import wire

        self.name = name
        self.agent_id = f"bench{random.getrandbits(40):010x}"
        uuids = [f"GPU-bench-{name}-{i}" for i in range(gpus)]
        self.inventory = [wire.GpuInfo(uuid=u, index=i) for i, u in enumerate(uuids)]
        # Its rank table, in every batch as an agent sends it (`--ranks`; None: none,
        # so the backend's rank statements, `_unlisted_ranks` among them, do not run):
        # ranks of one job over every node of the run, as the goal's one large job.
        first = int(name.rsplit("-", 1)[-1]) * ranks if ranks else 0  # bench-00012
        self.ranks = [
            wire.RankStatus(job="bench", rank=first + r, pid=1000 + r, local_rank=r)
            for r in range(ranks)
        ] or None
        # The node's samples are built once and refreshed in place for each batch: the
        # generator shares the machine with what it measures (42 -> 30 us a batch).
        self.samples = [busy_sample(u, 0.0) for _ in range(per_batch) for u in uuids]
        # The node's batches are due at its planned phase and every batch_interval after
        # it, not from whenever the generator first got to it: started late by a busy
        # process, the nodes' phases bunched, and the server got 1,000 to 3,000 batches
        # a second in waves of the interval for 2,048 offered. Set with the schedule.
        self.nxt = 0.0  # when its next batch is due (monotonic)
        self.end = 0.0  # no batch due at or after it is sent
        self.seq = 0
        self.body = b""  # the batch in flight, whole request
        self.t0 = 0.0  # its first send (perf_counter): latency counts from there
        self.refusals = 0  # 503 answers it got so far
        self.resend = False  # due again after a 503, not a new batch
        self.busy = False  # a request is in flight
        self.sock: socket.socket | None = None
        self.fresh = False  # the connection was opened for the request in flight
        self.retried = False  # the request was sent again on a new connection
        self.out = b""  # what is left to send of the request
        self.answer = bytearray()  # what has come of the answer


def _parse_answer(buf: bytearray) -> tuple[int, float] | None:
    """A complete HTTP answer at the start of `buf`: its status and its Retry-After in
    seconds (0 when none); None while it is not all there."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buf[: end + 2]).lower()
    at = head.find(b"\r\ncontent-length:")
    length = int(head[at + 17 : head.index(b"\r\n", at + 2)]) if at >= 0 else 0
    if len(buf) < end + 4 + length:
        return None
    at = head.find(b"\r\nretry-after:")
    retry_after = float(head[at + 14 : head.index(b"\r\n", at + 2)]) if at >= 0 else 0.0
    return int(head.split(None, 2)[1]), retry_after


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
    ranks: int = 0,
) -> None:
    """One generator process: its nodes' batches, each on the node's own keep-alive
    connection, from one epoll loop over non-blocking sockets and a heap of due times.

    The generator shares the machine with what it measures, so it must cost far less
    than the server: httpx's async client did not, and a coroutine per node on asyncio
    streams (uvloop) took 0.34-0.40 cores at 2,048 batches/s, this loop 0.24-0.33 with
    the connects of the start, 0.22 after them (docs/benchmarks.md, "The pruner's first
    run, and a leaner load generator")."""
    from trainguard.protocol import wire

    encode = wire.encode_msgpack if encoding == "msgpack" else wire.encode
    content_type = wire.MSGPACK_TYPE if encoding == "msgpack" else wire.JSON_TYPE
    host, port = url.removeprefix("http://").split(":")
    addr = (host, int(port))
    head = (
        f"POST /api/v1/ingest HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: "
    ).encode()
    per_batch = max(1, round(batch_interval / period))  # samples per GPU per batch
    # The nodes start over `spread` seconds; every node sends from its start to
    # `duration` after it, so all of them do in [spread, duration] after the start.
    spread = max(ramp, batch_interval)
    lat: list[tuple[float, float]] = []  # (when answered, epoch s; latency s)
    first: list[float] = []
    steady: list[float] = []
    slip: list[float] = []  # how late each batch left its schedule
    err: list[int] = []
    answers_503: list[int] = []  # per batch, how many 503 answers it got before the last
    ep = select.epoll()
    by_fd: dict[int, _Node] = {}
    due: list[tuple[float, int, _Node]] = []  # (when, tie-break, node)
    # Every node's state first (0.25 s for 8,192 nodes), then the schedule: started
    # before it, the nodes whose phase passed meanwhile would all go at once.
    ready = [_Node(name, gpus, per_batch, ranks) for name in nodes]
    t_start = time.monotonic()
    all_on = (t_start + spread, t_start + duration)  # the span when every node sends
    for i, (node, phase) in enumerate(zip(ready, node_phases(len(nodes), spread), strict=True)):
        node.nxt = t_start + phase
        node.end = node.nxt + duration
        heapq.heappush(due, (node.nxt, i, node))
    order = len(nodes)
    active = len(nodes)
    rand = random.random

    def close(n: _Node) -> None:
        if n.sock is not None:
            by_fd.pop(n.sock.fileno(), None)
            n.sock.close()  # and out of the epoll set
            n.sock = None

    def send(n: _Node) -> None:
        """Send the batch in flight, on a new connection where the node has none."""
        n.out, n.answer, n.busy = n.body, bytearray(), True
        if n.sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as asyncio's
            n.sock, n.fresh = sock, True
            by_fd[sock.fileno()] = n
            if sock.connect_ex(addr) not in (0, errno.EINPROGRESS):
                failed(n)
                return
            ep.register(sock, select.EPOLLOUT)  # writable once connected
            return
        write(n)

    def write(n: _Node) -> None:
        assert n.sock is not None
        try:
            sent = n.sock.send(n.out)
        except BlockingIOError:
            sent = 0
        except OSError:
            failed(n)
            return
        n.out = n.out[sent:]
        if n.out:
            ep.modify(n.sock, select.EPOLLIN | select.EPOLLOUT)

    def failed(n: _Node) -> None:
        """The connection failed or closed: a kept one the server closed while idle fails
        on first use, so the request goes once more on a new connection, as an HTTP
        client's pool does; otherwise the batch failed (status 0)."""
        close(n)
        if not n.fresh and not n.retried:
            n.retried = True
            send(n)
        else:
            answered(n, 0, 0.0)

    def answered(n: _Node, status: int, retry_after: float) -> None:
        nonlocal order
        n.busy = False
        # 503 (the database unavailable, a proxy's overload): sent again after
        # Retry-After and the agent's jitter (agent/uplink/sender.py), until one interval past
        # the end. Latency is from the first send to the answer that stored it.
        if status == 503 and time.monotonic() + retry_after <= n.end + batch_interval:
            backoff = min(30.0, 0.5 * 2**n.refusals)
            n.refusals += 1
            n.resend = True
            order += 1
            again = time.monotonic() + retry_after + random.uniform(0, backoff)
            heapq.heappush(due, (again, order, n))
            return
        answers_503.append(n.refusals)
        if status == 200:
            # An agent's first batch registers its node and GPUs: a one-time cost,
            # reported apart from the steady state.
            took = time.perf_counter() - n.t0
            if n.seq == 1:
                first.append(took)
            else:
                lat.append((time.time(), took))
                if all_on[0] <= n.nxt < all_on[1]:
                    steady.append(took)
        else:
            err.append(status)
        n.nxt += batch_interval
        order += 1
        heapq.heappush(due, (n.nxt, order, n))

    def start_batch(n: _Node) -> bool:
        """Send the node's next batch; False when the node is done: a batch goes if it
        was due before the end and the end has not passed (a batch behind schedule at
        the end is not sent: the run measures what the server kept up with)."""
        if not (n.nxt < n.end and time.monotonic() < n.end):
            close(n)
            return False
        n.seq += 1
        now = time.time()
        samples = n.samples
        for i, sample in enumerate(samples):  # oldest first, as an agent's outbox
            sample.ts = now - (per_batch - 1 - i // gpus) * period
            sample.util = 80.0 + 20.0 * rand()
            sample.temp_c = 55.0 + 20.0 * rand()
        body = encode(
            wire.Batch(
                node=n.name,
                agent_id=n.agent_id,
                seq=n.seq,
                sent_at=now,
                simulated=True,
                gpus=n.inventory if n.seq == 1 else None,
                samples=samples,
                ranks=n.ranks,
            )
        )
        n.body = head + str(len(body)).encode() + b"\r\n\r\n" + body
        slip.append(time.monotonic() - n.nxt)
        n.t0 = time.perf_counter()
        n.refusals, n.retried = 0, False
        send(n)
        return True

    while active:
        timeout = max(0.0, due[0][0] - time.monotonic()) if due else -1.0
        for fd, events in ep.poll(timeout):
            n = by_fd.get(fd)
            if n is None or n.sock is None:
                continue
            if n.out and events & (select.EPOLLOUT | select.EPOLLERR | select.EPOLLHUP):
                if n.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    failed(n)  # the connect failed
                    continue
                write(n)
                if not n.out and n.sock is not None:
                    ep.modify(n.sock, select.EPOLLIN)
                continue
            if events & (select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP):
                try:
                    data = n.sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:  # closed: by the server while idle, or under a request
                    if n.busy:
                        failed(n)
                    else:
                        close(n)
                    continue
                n.answer += data
                parsed = _parse_answer(n.answer)
                if parsed is None:
                    continue
                n.fresh = False  # the connection answered: it is a kept one from now on
                status, retry_after = parsed
                answered(n, status, retry_after)
        now = time.monotonic()
        while due and due[0][0] <= now:
            n = heapq.heappop(due)[2]
            if n.resend:
                n.resend, n.retried = False, False
                send(n)
            elif not start_batch(n):
                active -= 1
    ep.close()
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
    ranks: int = 0,
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
                    ranks,
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
        "ranks_per_node": ranks,
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
