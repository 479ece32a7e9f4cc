"""`trainguard bench ingest` end to end at a tiny size: a real server process, real HTTP,
paced batches of several samples per GPU; what it reports is what the database holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select

from tests.conftest import _truncate
from tests.support import free_port
from trainguard.backend.bench import ingest
from trainguard.backend.models import IngestBatch, Sample


@pytest.mark.slow
def test_a_paced_run_stores_every_sample_it_sent(tmp_path: Path) -> None:
    report = ingest.run(
        nodes=6,
        gpus=4,
        duration=3.0,
        period=0.5,
        workers=1,
        database_url=None,
        data_dir=tmp_path,
        port=free_port(),
        out_json=tmp_path / "r.json",
        batch_interval=1.0,
    )
    engine = create_engine(f"sqlite:///{tmp_path / 'bench.db'}")
    with engine.connect() as conn:
        samples = conn.execute(select(func.count()).select_from(Sample)).scalar_one()
        batches = conn.execute(select(func.count()).select_from(IngestBatch)).scalar_one()
    engine.dispose()
    # 6 nodes x ceil(3 / 1) batches, each 2 samples (0.5 s apart) of 4 GPUs.
    assert report["batches_sent"] == report["batches_ok"] == batches == 18
    assert report["stored_samples"] == samples == 18 * 2 * 4
    assert report["stored_of_sent"] == 1.0 and report["errors"] == 0
    assert report["stored_samples_per_s"] == report["offered_samples_per_s"] == 48
    assert (tmp_path / "r.json").read_text().startswith("{")
    # The server's log is kept beside the run, and a clean run left no warning in it.
    assert (
        Path(report["server_log"]) == tmp_path / "server.log" and report["server_log_warnings"] == 0
    )


@pytest.mark.slow
def test_a_ramped_run_starts_its_nodes_over_the_ramp_and_times_the_span_all_send(
    tmp_path: Path,
) -> None:
    """6 nodes batching every second start over 3 s, each then sending for 5 s: their
    first batches are 2 s or more apart end to end (one node in each half second of the
    ramp), and each node has 2 batches due while all 6 are sending (3 s to 5 s)."""
    report = ingest.run(
        nodes=6,
        gpus=2,
        duration=5.0,
        period=1.0,
        workers=1,
        database_url=None,
        data_dir=tmp_path,
        port=free_port(),
        out_json=None,
        ramp=3.0,
    )
    engine = create_engine(f"sqlite:///{tmp_path / 'bench.db'}")
    with engine.connect() as conn:
        firsts = (
            conn.execute(select(IngestBatch.received_at).where(IngestBatch.seq == 1))
            .scalars()
            .all()
        )
    engine.dispose()
    assert report["batches_sent"] == report["batches_ok"] == 6 * 5 and report["errors"] == 0
    assert len(firsts) == 6 and max(firsts) - min(firsts) >= 2.0
    assert report["ramp_s"] == 3.0 and report["batches_all_nodes"] == 6 * 2
    assert report["latency_p99_all_nodes_ms"] is not None


def test_the_warnings_in_a_kept_server_log_are_counted(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "2026-12-02 05:00:00,001 INFO trainguard.backend.app: started\n"
        "2026-12-02 05:00:01,002 WARNING trainguard.backend.ingest.writer: ingest transaction"
        " failed (12 batches): boom; one by one\n"
        "2026-12-02 05:00:02,003 ERROR uvicorn.error: Exception in ASGI application\n"
        "Traceback (most recent call last):\n"
    )
    assert ingest._warnings(log) == 2


@pytest.mark.slow
@pytest.mark.postgres
def test_two_server_processes_store_every_msgpack_sample_and_report_each_process(
    tmp_path: Path, pg_database: str
) -> None:
    _truncate(pg_database)
    report = ingest.run(
        nodes=8,
        gpus=2,
        duration=3.0,
        period=0.5,
        workers=2,
        database_url=pg_database,
        data_dir=tmp_path,
        port=free_port(),
        out_json=None,
        batch_interval=1.0,
        server_workers=2,
        encoding="msgpack",
    )
    engine = create_engine(pg_database)
    with engine.connect() as conn:
        samples = conn.execute(select(func.count()).select_from(Sample)).scalar_one()
    engine.dispose()
    assert report["errors"] == 0 and report["batches_sent"] == report["batches_ok"] == 24
    assert report["stored_samples"] == samples == 24 * 2 * 2
    # The supervisor and its two workers, each measured; the two generators too.
    assert len(report["backend_cpu_pct_by_process"]) == 3
    assert len(report["backend_rss_mib_by_process"]) == 3
    assert report["backend_rss_mib"] == pytest.approx(sum(report["backend_rss_mib_by_process"]))
    assert len(report["load_generator_cpu_cores_by_process"]) == 2
    assert report["raw_copy_rows_per_s"] > 0 and report["raw_copy_into_samples_rows_per_s"] > 0
    # PostgreSQL's write side over the run: its sizes as set, and the WAL it wrote per
    # stored sample (every sample writes at least its own row).
    assert report["postgres_shared_buffers"] and report["postgres_max_wal_size"]
    assert report["postgres_checkpoint_timeout"]
    assert report["postgres_checkpoints"] >= 0
    assert report["postgres_wal_bytes_per_sample"] > 50


@pytest.mark.postgres
def test_postgres_state_counts_the_wal_written_between_two_readings(pg_database: str) -> None:
    engine = create_engine(pg_database)
    before = ingest.postgres_state(pg_database)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS wal_probe_kept (x text)")
        conn.exec_driver_sql(
            "INSERT INTO wal_probe_kept SELECT repeat('x', 1000) FROM generate_series(1, 100)"
        )
        conn.exec_driver_sql("DROP TABLE wal_probe_kept")
    engine.dispose()
    after = ingest.postgres_state(pg_database)
    report = ingest.postgres_report(before, after, stored=100)
    # 100 rows of 1 kB went into the WAL: at least 1 kB a "sample".
    assert report["postgres_wal_bytes_per_sample"] >= 1000
    assert report["postgres_checkpoints"] >= 0
    assert ingest.postgres_state("sqlite:///unused.db") == {}
    assert ingest.postgres_report({}, {}, stored=1) == {}


def test_the_nodes_batches_are_spread_evenly_over_the_interval() -> None:
    """16,384 nodes batching every 8 s: each second of the interval holds the batches of
    exactly 2,048 of them (what the goal offers), at random places within it."""
    phases = ingest.node_phases(16384, 8.0)
    assert all(0.0 <= p < 8.0 for p in phases)
    per_second = [0] * 8
    for p in phases:
        per_second[int(p)] += 1
    assert per_second == [2048] * 8
    per_slice = [0] * 16384
    for p in phases:
        per_slice[int(p * 16384 / 8.0)] += 1
    assert per_slice == [1] * 16384  # one node in each 0.5 ms slice ...
    assert phases != ingest.node_phases(16384, 8.0)  # ... at a random place in it


def generate_against(handle: Any, period: float, duration: float) -> dict[str, Any]:
    """One generator process's run for one node of one GPU (a batch every `period`), against
    a fake server on asyncio whose connections `handle` serves; the generator's report."""
    import asyncio
    import queue
    import threading

    ready = threading.Event()
    port = free_port()

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        ready.set()
        async with server:
            await asyncio.sleep(30)

    threading.Thread(target=asyncio.run, args=(serve(),), daemon=True).start()
    ready.wait(10)
    out: queue.Queue = queue.Queue()
    ingest._gen_worker(f"http://127.0.0.1:{port}", ["n0"], 1, period, period, duration, out)
    result: dict[str, Any] = out.get(timeout=5)
    return result


def test_the_generator_sends_a_batch_again_after_a_503_and_retry_after_and_counts_it() -> None:
    """A server that answers each batch's first send with 503 and Retry-After: 1, as an
    unavailable database does: every batch is sent again after it (as an agent does),
    counted once, its latency from the first send."""
    import asyncio

    from trainguard.protocol import wire

    seen: list[tuple[int, int]] = []  # (seq, status answered)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tried: set[int] = set()
        while head := await reader.readuntil(b"\r\n\r\n"):
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            seq = wire.decode_batch(await reader.readexactly(length)).seq
            status = 200 if seq in tried else 503
            tried.add(seq)
            seen.append((seq, status))
            extra = b"Retry-After: 1\r\n" if status == 503 else b""
            writer.write(b"HTTP/1.1 %d X\r\n%sContent-Length: 2\r\n\r\n{}" % (status, extra))

    result = generate_against(handle, 2.0, 4.0)
    assert seen == [(1, 503), (1, 200), (2, 503), (2, 200)]
    assert (result["answers_503"], result["sent_again"], result["errors"]) == (2, 2, 0)
    assert len(result["first"]) == 1 and len(result["lat"]) == 1
    assert result["first"][0] >= 1.0 and result["lat"][0][1] >= 1.0  # waited Retry-After


def test_the_generator_resends_once_on_a_new_connection_when_a_kept_one_fails() -> None:
    """A kept connection the server dropped fails on first use: the batch goes again on a
    new connection, as an HTTP client's pool does, and counts as sent once. A connection
    the server closes while the node is idle is replaced at the next batch."""
    import asyncio

    from trainguard.protocol import wire

    seen: list[tuple[int, int, str]] = []  # (connection, seq, what the server did)
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        conn = connections
        while head := await reader.readuntil(b"\r\n\r\n"):
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            seq = wire.decode_batch(await reader.readexactly(length)).seq
            if seq == 2 and conn == 1:  # the kept connection, gone stale: dropped unanswered
                seen.append((conn, seq, "dropped"))
                writer.close()
                return
            seen.append((conn, seq, "200"))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
            if seq == 2:  # an idle timeout: closed after the answer
                writer.close()
                return

    result = generate_against(handle, 1.5, 4.5)
    assert seen == [(1, 1, "200"), (1, 2, "dropped"), (2, 2, "200"), (3, 3, "200")]
    assert (result["errors"], result["answers_503"]) == (0, 0)
    assert len(result["first"]) == 1 and len(result["lat"]) == 2
