"""POST /api/v1/ingest: validation, idempotence, and that nothing is half-stored."""

from __future__ import annotations

import threading
import time
from typing import Any

import msgspec
from sqlalchemy import create_engine, func, select, text

from trainguard.backend.models import Event, IngestBatch, Sample, Step
from trainguard.protocol import wire

NODE = "node-a"


def make_batch(seq: int, n: int = 8, agent_id: str = "agent000001", node: str = NODE) -> bytes:
    now = time.time()
    return wire.encode(
        wire.Batch(
            node=node,
            agent_id=agent_id,
            seq=seq,
            sent_at=now,
            simulated=True,
            gpus=[wire.GpuInfo(uuid=f"GPU-{node}-{i}", index=i) for i in range(n)],
            samples=[
                wire.GpuSample(uuid=f"GPU-{node}-{i}", ts=now, util=float(i), temp_c=50.0 + i)
                for i in range(n)
            ],
            events=[wire.Event(kind="xid", ts=now, xid=13, gpu_uuid=f"GPU-{node}-0")],
            steps=[wire.StepReport(job="job-1", rank=0, step=seq, start=now - 0.1, end=now)],
        )
    )


def count(url: str, model: Any) -> int:
    engine = create_engine(url)
    with engine.connect() as conn:
        n = conn.execute(select(func.count()).select_from(model)).scalar_one()
    engine.dispose()
    return int(n)


def test_batch_is_stored_and_counted(client: Any, db_url: str) -> None:
    r = client.post("/api/v1/ingest", content=make_batch(1))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body == {**body, "duplicate": False, "stored_samples": 8, "stored_events": 1}
    assert count(db_url, Sample) == 8
    assert count(db_url, Step) == 1


def test_replayed_batch_is_stored_once(client: Any, db_url: str) -> None:
    first = client.post("/api/v1/ingest", content=make_batch(1))
    again = client.post("/api/v1/ingest", content=make_batch(1))
    assert first.json()["duplicate"] is False
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert count(db_url, Sample) == 8
    assert count(db_url, Event) == 1
    assert count(db_url, IngestBatch) == 1
    # The same seq from another agent process is another batch.
    other = client.post("/api/v1/ingest", content=make_batch(1, agent_id="agent000002"))
    assert other.json()["duplicate"] is False
    assert count(db_url, Sample) == 16


def test_one_malformed_sample_rejects_the_whole_batch_naming_the_field(
    client: Any, db_url: str
) -> None:
    raw = msgspec.json.decode(make_batch(1))
    raw["samples"][5]["temp_c"] = "hot"
    r = client.post("/api/v1/ingest", content=msgspec.json.encode(raw))
    assert r.status_code == 422
    assert "$.samples[5].temp_c" in r.json()["detail"]
    assert count(db_url, Sample) == 0 and count(db_url, Event) == 0
    assert count(db_url, IngestBatch) == 0


def test_out_of_range_and_unknown_fields_are_refused(client: Any) -> None:
    raw = msgspec.json.decode(make_batch(1))
    raw["samples"][0]["util"] = 250.0
    r = client.post("/api/v1/ingest", content=msgspec.json.encode(raw))
    assert r.status_code == 422 and "$.samples[0].util" in r.json()["detail"]
    raw = msgspec.json.decode(make_batch(1))
    raw["surprise"] = 1
    r = client.post("/api/v1/ingest", content=msgspec.json.encode(raw))
    assert r.status_code == 422 and "surprise" in r.json()["detail"]


def test_bad_json_too_large_and_future_timestamps(make_client: Any) -> None:
    client = make_client(max_body_bytes=4096)
    r = client.post("/api/v1/ingest", content=b"{not json")
    assert r.status_code == 400 and "malformed JSON" in r.json()["detail"]
    r = client.post("/api/v1/ingest", content=make_batch(1, n=60))
    assert r.status_code == 413
    raw = msgspec.json.decode(make_batch(2))
    raw["samples"][1]["ts"] = time.time() + 7 * 86400
    r = client.post("/api/v1/ingest", content=msgspec.json.encode(raw))
    assert r.status_code == 422 and "$.samples[1].ts" in r.json()["detail"]


def test_a_msgpack_batch_is_stored_as_its_json_twin_would_be(client: Any, db_url: str) -> None:
    batch = wire.decode_batch(make_batch(1))
    body = wire.encode_msgpack(batch)
    assert wire.decode_batch_msgpack(body) == batch  # the binary encoding round-trips
    r = client.post("/api/v1/ingest", content=body, headers={"Content-Type": "application/msgpack"})
    assert r.status_code == 200, r.text
    assert r.json()["duplicate"] is False and r.json()["stored_samples"] == 8
    assert "application/msgpack" in r.headers["accept-post"]
    # The same batch in JSON is the same batch: a replay, stored once.
    again = client.post(
        "/api/v1/ingest",
        content=wire.encode(batch),
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert count(db_url, Sample) == 8 and count(db_url, IngestBatch) == 1


def test_an_unknown_content_type_is_refused_with_415_and_nothing_stored(
    client: Any, db_url: str
) -> None:
    r = client.post("/api/v1/ingest", content=make_batch(1), headers={"Content-Type": "text/csv"})
    assert r.status_code == 415
    assert "text/csv" in r.json()["detail"] and "application/msgpack" in r.headers["accept-post"]
    r = client.post(
        "/api/v1/ingest", content=b"\xc1", headers={"Content-Type": "application/msgpack"}
    )
    assert r.status_code == 400 and "malformed MessagePack" in r.json()["detail"]
    raw = msgspec.json.decode(make_batch(1))
    raw["samples"][2]["util"] = "busy"
    r = client.post(
        "/api/v1/ingest",
        content=msgspec.msgpack.encode(raw),
        headers={"Content-Type": "application/msgpack"},
    )
    assert r.status_code == 422 and "$.samples[2].util" in r.json()["detail"]
    assert count(db_url, Sample) == 0 and count(db_url, IngestBatch) == 0


def test_ingest_needs_a_valid_token(client: Any) -> None:
    r = client.post("/api/v1/ingest", content=make_batch(1), headers={"Authorization": ""})
    assert r.status_code == 401
    r = client.post(
        "/api/v1/ingest", content=make_batch(1), headers={"Authorization": "Bearer nope"}
    )
    assert r.status_code == 401


def test_batches_and_their_refusals_are_answered_ahead_of_fastapis_stack(client: Any) -> None:
    """Agents' batches skip FastAPI's own call (its telemetry check, Starlette's error
    middleware, routing): the app answers them itself, with the same bodies. Every other
    request still goes through the stack."""
    stack = client.app.middleware_stack
    entered: list[str] = []

    async def counting(scope: Any, receive: Any, send: Any) -> None:
        entered.append(scope["path"])
        await stack(scope, receive, send)

    client.app.middleware_stack = counting
    ok = client.post("/api/v1/ingest", content=make_batch(1))
    no_token = client.post("/api/v1/ingest", content=make_batch(2), headers={"Authorization": ""})
    bad_type = client.post(
        "/api/v1/ingest", content=make_batch(3), headers={"Content-Type": "text/csv"}
    )
    assert ok.status_code == 200 and ok.json()["stored_samples"] == 8
    assert no_token.status_code == 401 and "bearer token" in no_token.json()["detail"]
    assert bad_type.status_code == 415 and "text/csv" in bad_type.json()["detail"]
    assert entered == []
    assert client.get("/api/v1/nodes").status_code == 200
    assert entered == ["/api/v1/nodes"]


def test_concurrent_batches_from_many_nodes_are_all_stored_exactly_once(
    client: Any, db_url: str
) -> None:
    nodes, per_node = 8, 5
    errors: list[str] = []

    def agent(i: int) -> None:
        for seq in range(1, per_node + 1):
            for _ in range(2):  # every batch sent twice, as a retry after a lost answer
                r = client.post("/api/v1/ingest", content=make_batch(seq, node=f"n{i}"))
                if r.status_code != 200:
                    errors.append(r.text)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert count(db_url, IngestBatch) == nodes * per_node
    assert count(db_url, Sample) == nodes * per_node * 8


def test_the_answer_paces_agents_with_the_configured_batch_interval(make_client: Any) -> None:
    client = make_client(agent_batch_interval_s=4.0)
    r = client.post("/api/v1/ingest", content=make_batch(1))
    assert r.status_code == 200 and r.json()["batch_interval_s"] == 4.0


def test_a_batch_interval_that_would_mark_healthy_nodes_degraded_is_refused() -> None:
    import pydantic

    from trainguard.backend.settings import Settings

    assert Settings(agent_batch_interval_s=5, node_down_after_s=15).agent_batch_interval_s == 5
    assert Settings(node_down_after_s=0.2).agent_batch_interval_s == 0  # default: no pace
    try:
        Settings(agent_batch_interval_s=5.5, node_down_after_s=15)
    except pydantic.ValidationError as exc:
        assert "between 0 and a third of node_down_after_s (5 s)" in str(exc)
    else:
        raise AssertionError("a batch interval over a third of the down threshold was accepted")


def test_the_writer_reconnects_when_its_kept_connection_is_killed(
    pg_database: str, tmp_path: Any
) -> None:
    """The writer keeps one connection between transactions (no ping per group): when
    PostgreSQL drops it, the next batch still gets a 200 on a fresh connection."""
    from fastapi.testclient import TestClient
    from sqlalchemy import text

    from tests.conftest import _truncate
    from tests.support import AUTH, TOKEN
    from trainguard.backend.app import create_app
    from trainguard.backend.settings import Settings

    _truncate(pg_database)
    settings = Settings(database_url=pg_database, admin_token=TOKEN, data_dir=tmp_path)
    with TestClient(create_app(settings), headers=AUTH) as client:
        assert client.post("/api/v1/ingest", content=make_batch(1)).status_code == 200
        writer = client.app.state.writer
        pid = writer._conn.connection.driver_connection.info.backend_pid
        admin = create_engine(pg_database, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
        admin.dispose()
        r = client.post("/api/v1/ingest", content=make_batch(2))
        assert r.status_code == 200, r.text
        assert r.json()["stored_samples"] == 8
        assert writer._conn.connection.driver_connection.info.backend_pid != pid
    assert count(pg_database, Sample) == 16


def test_the_node_summary_follows_its_batches(client: Any, db_url: str) -> None:
    """nodes.util_avg / temp_max come from the newest batch with samples, last_xid_at from
    the newest XID, last_seen and the clock offset from every batch (one statement for the
    whole group on PostgreSQL, an executemany per shape on SQLite: the same row)."""
    from trainguard.backend.models import Node

    def node() -> Any:
        engine = create_engine(db_url)
        with engine.connect() as conn:
            row = conn.execute(select(Node).where(Node.name == NODE)).one()
        engine.dispose()
        return row

    assert client.post("/api/v1/ingest", content=make_batch(1)).status_code == 200
    first = node()
    assert (first.util_avg, first.temp_max) == (3.5, 57.0)
    assert first.last_xid_at is not None and first.agent_id == "agent000001"
    assert abs(first.clock_offset_s) < 5
    quiet = wire.Batch(node=NODE, agent_id="agent000001", seq=2, sent_at=time.time() - 30)
    assert client.post("/api/v1/ingest", content=wire.encode(quiet)).status_code == 200
    second = node()
    assert (second.util_avg, second.temp_max, second.last_xid_at) == (
        3.5,
        57.0,
        first.last_xid_at,
    )
    assert second.last_seen >= first.last_seen
    assert -32 < second.clock_offset_s < -28  # this batch was "sent" 30 s before arriving


def test_evidence_in_a_busy_group_is_stored_first_in_its_own_transaction(db_url: str) -> None:
    """Batches queued together form one group; the one carrying an event (evidence the
    engine waits for) is committed before the routine ones, in its own transaction."""
    from trainguard.backend import db
    from trainguard.backend.ingest.writer import IngestWriter

    order: list[list[int]] = []
    engine = db.make_engine(db_url)
    writer = IngestWriter(
        engine, on_stored=lambda stored: order.append([b.seq for b, _ in stored.batches])
    )
    routine = [wire.decode_batch(make_batch(seq)) for seq in range(1, 11)]
    for b in routine:
        b.events = []
    evidence = wire.decode_batch(make_batch(11))  # carries an XID event
    futures = [writer.submit(b, time.time()) for b in (*routine[:5], evidence, *routine[5:])]
    writer.start()  # everything is queued already: one group
    try:
        results = [f.result(timeout=30) for f in futures]
    finally:
        writer.stop()
        engine.dispose()
    assert [r.duplicate for r in results] == [False] * 11
    assert order == [[11], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
    assert writer.stats["transactions"] == 2 and writer.stats["batches"] == 11
    assert count(db_url, Sample) == 88


def test_a_group_waits_for_company_while_it_holds_fewer_than_min_group_batches(
    db_url: str,
) -> None:
    """writer_min_group_batches: a lone batch waits up to max_delay_s for others (one
    transaction for two batches 0.1 s apart); with 1 it is stored at once, alone."""
    from trainguard.backend import db
    from trainguard.backend.ingest.writer import IngestWriter

    transactions = {}
    for min_group in (100, 1):
        engine = db.make_engine(db_url)
        writer = IngestWriter(engine, max_delay_s=2.0, min_group=min_group)
        writer.start()
        try:
            batches = [
                wire.decode_batch(make_batch(seq, agent_id=f"agent{min_group:06d}"))
                for seq in (1, 2)
            ]
            for b in batches:
                b.events = []  # evidence never waits: routine batches only
            first = writer.submit(batches[0], time.time())
            time.sleep(0.1)
            second = writer.submit(batches[1], time.time())
            assert not first.result(timeout=30).duplicate
            assert not second.result(timeout=30).duplicate
        finally:
            writer.stop()
            engine.dispose()
        transactions[min_group] = writer.stats["transactions"]
    assert transactions == {100: 1, 1: 2}
    assert count(db_url, Sample) == 4 * 8


def test_every_reading_is_stored_in_its_column(client: Any, db_url: str) -> None:
    """Each wire field lands in the column of its name (the writer copies a sample's
    fields in wire order), missing readings as NULL."""
    from trainguard.backend.ingest.statements import SAMPLE_COLUMNS
    from trainguard.backend.models import SAMPLE_READINGS

    # The wire's field order is the columns' (the rows the writer copies out).
    assert [f.name for f in msgspec.structs.fields(wire.GpuSample)] == ["uuid", *SAMPLE_COLUMNS[1:]]
    now = time.time()
    ints = {"clock_event_reasons", "ecc_sbe_volatile", "ecc_dbe_volatile", "pcie_replay"}
    ints |= {"remapped_correctable", "remapped_uncorrectable"}
    full = {
        f: (i % 2 == 0) if f.startswith("remap_") else (i + 1 if f in ints else i + 1.5)
        for i, f in enumerate(SAMPLE_READINGS)
    }
    sent = [
        wire.GpuSample(uuid="GPU-cols-0", ts=now, **full),
        wire.GpuSample(uuid="GPU-cols-1", ts=now, util=7.0),
    ]
    batch = wire.Batch(node="cols", agent_id="agent000001", seq=1, sent_at=now, samples=sent)
    assert client.post("/api/v1/ingest", content=wire.encode(batch)).status_code == 200
    engine = create_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(
            select(Sample.ts, *(getattr(Sample, f) for f in SAMPLE_READINGS)).order_by(
                Sample.gpu_id
            )
        ).all()
    engine.dispose()
    assert [dict(r._mapping) for r in rows] == [
        {"ts": now, **full},
        {"ts": now, **{f: (7.0 if f == "util" else None) for f in SAMPLE_READINGS}},
    ]


def test_a_group_answers_every_waiting_coroutine_even_when_one_gave_up(db_url: str) -> None:
    """submit_async: the writer hands a group's results to their event loop in one call.
    A waiter cancelled meanwhile (its client went away) is skipped: the batch is stored
    all the same, and the others in the group still get their answers."""
    import asyncio

    from trainguard.backend import db
    from trainguard.backend.ingest.writer import IngestWriter

    engine = db.make_engine(db_url)
    writer = IngestWriter(engine)

    async def main() -> list[Any]:
        batches = [wire.decode_batch(make_batch(seq)) for seq in range(1, 6)]
        waiters = [writer.submit_async(b, time.time()) for b in batches]
        waiters[2].cancel()
        writer.start()  # everything is queued already: one group
        return await asyncio.gather(*waiters, return_exceptions=True)

    try:
        outcomes = asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        writer.stop()
        engine.dispose()
    assert isinstance(outcomes[2], asyncio.CancelledError)
    answered = [o for i, o in enumerate(outcomes) if i != 2]
    assert [(o.seq, o.duplicate, o.stored_samples) for o in answered] == [
        (1, False, 8),
        (2, False, 8),
        (4, False, 8),
        (5, False, 8),
    ]
    assert writer.stats["transactions"] == 1 and count(db_url, Sample) == 40


def test_sqlite_counts_the_writes_waiting_for_its_lock_but_not_the_ingest_writers(
    tmp_path: Any,
) -> None:
    """backend/db.py: WriteWaiters. A write statement is counted while it runs (waiting
    for SQLite's lock, or holding it), reads are not, a failed write is not left counted,
    and the ingest writer's own connection is never counted."""
    from sqlalchemy import event, text
    from sqlalchemy.exc import IntegrityError

    from trainguard.backend import db

    url = f"sqlite:///{tmp_path / 'w.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)
    waiters = db.write_waiters(engine)
    assert waiters is not None
    assert db.write_waiters(db.make_engine("postgresql+psycopg://u@127.0.0.1:1/none")) is None
    seen: list[tuple[str, int]] = []

    @event.listens_for(engine, "before_cursor_execute")  # runs after the counting listener
    def _look(conn: Any, _c: Any, statement: str, *_: Any) -> None:
        seen.append((statement.split()[0].upper(), waiters.count))

    try:
        with engine.begin() as conn:
            conn.execute(text("SELECT 1"))
            conn.execute(text("UPDATE nodes SET clock_offset_s = 1"))
        assert seen == [("SELECT", 0), ("UPDATE", 1)] and waiters.count == 0
        with engine.connect() as conn:
            try:
                with conn.begin():  # the same id twice: the second insert fails
                    for _ in range(2):
                        conn.execute(text("INSERT INTO nodes (id, name) VALUES (7, 'n7')"))
            except IntegrityError:
                pass
        assert waiters.count == 0
        seen.clear()
        with engine.connect() as conn:
            conn.info["ingest_writer"] = True
            with conn.begin():
                conn.execute(text("UPDATE nodes SET clock_offset_s = 2"))
        assert seen == [("UPDATE", 0)]
    finally:
        engine.dispose()


def test_the_ingest_writer_lets_a_waiting_sqlite_write_in_after_each_commit(
    tmp_path: Any,
) -> None:
    """SQLite's busy handler is not fair: a write waiting for the lock sleeps (up to 100 ms)
    and retries, while the ingest writer, committing group after group under load, takes
    the lock again within microseconds. Agents' acks waited 5-30 s or failed under 2,048
    nodes (docs/engine.md). After each commit, the writer holds off while a write waits."""
    from trainguard.backend import db
    from trainguard.backend.ingest.writer import IngestWriter

    url = f"sqlite:///{tmp_path / 'busy.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)
    waiters = db.write_waiters(engine)
    assert waiters is not None
    # One batch a group; a yield as long as the test needs (0.2 s by default).
    writer = IngestWriter(engine, max_delay_s=0.0, max_rows=64, yield_max_s=60.0)
    batches = [wire.decode_batch(make_batch(seq, n=64)) for seq in range(1, 4)]
    released = threading.Event()
    waiters.enter()  # a write is waiting
    futures = [writer.submit(b, time.time()) for b in batches]
    writer.start()
    try:
        futures[0].result(timeout=30)
        time.sleep(0.2)  # the writer would have stored the next groups by now
        held = writer.stats["batches"]
        threading.Timer(0.0, lambda: (waiters.leave(), released.set())).start()
        results = [f.result(timeout=30) for f in futures]
    finally:
        if not released.is_set():
            waiters.leave()
        writer.stop()
        engine.dispose()
    assert held == 1  # it yielded after its first commit ...
    assert len(results) == 3 and writer.stats["batches"] == 3  # ... and went on after
    assert writer.stats["yielded"] >= 1


def test_the_nodes_update_finds_nodes_by_index_after_the_table_has_grown() -> None:
    """PostgreSQL caches a generic plan for a statement psycopg prepared (after 5 runs):
    made while `nodes` was small, it joins the group's nodes by a hash over a scan of the
    whole table, and keeps doing so at 20,000 nodes. The writer's nodes UPDATE is planned
    at every run, so it reads `nodes` by its primary key however small the table was when
    the connection began (counts from pg_stat_xact_user_tables, this transaction's own).
    Planned for a group of 10 of 20,000 nodes, the lookups are the cheaper plan; a group of
    thousands (a registration burst) is still joined by a hash, as it should be."""
    from tests.conftest import scratch_pg_database
    from trainguard.backend import db
    from trainguard.backend.ingest.writer import IngestWriter

    scans = text("SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relname = 'nodes'")
    with scratch_pg_database("tg_plan", "the nodes UPDATE's plan") as url:
        engine = db.make_engine(url)
        writer = IngestWriter(engine)  # not started: its statements run on this test's connection
        row = {"b_id": 1, "last_seen": 1.0, "agent_id": "a", "simulated": True}
        add_nodes = text(
            "INSERT INTO nodes (name, simulated, cordoned, first_seen, last_seen, gpus_lost) "
            "SELECT 'n' || i, true, false, 0, 0, 0 "
            "FROM generate_series(CAST(:first AS integer), CAST(:last AS integer)) AS i"
        )
        try:
            with engine.connect() as conn:
                # No autovacuum: an ANALYZE of `nodes` would replace a cached plan.
                conn.execute(text("ALTER TABLE nodes SET (autovacuum_enabled = false)"))
                conn.execute(add_nodes, {"first": 1, "last": 1})
                conn.commit()
                for _ in range(15):  # past psycopg's prepare threshold and PostgreSQL's 5
                    with conn.begin():
                        writer._update_nodes_pg(conn, [row])
                conn.execute(add_nodes, {"first": 2, "last": 20000})
                conn.commit()
                with conn.begin():
                    before = conn.execute(scans).one()
                    for n in range(25):  # groups of 10 nodes, as a busy writer's are
                        writer._update_nodes_pg(
                            conn, [{**row, "b_id": n * 100 + i + 1} for i in range(10)]
                        )
                    after = conn.execute(scans).one()
                updated = conn.execute(text("SELECT count(*) FROM nodes WHERE last_seen = 1.0"))
                assert updated.scalar_one() == 250
        finally:
            engine.dispose()
    assert after[0] - before[0] == 0, f"{after[0] - before[0]} scans of the whole nodes table"
    assert after[1] - before[1] >= 250  # a lookup by primary key per node updated


def test_the_writers_array_literals_read_back_as_the_values_they_were_made_of(
    pg_database: str,
) -> None:
    """The batch keys and the nodes UPDATE send their columns as array literals (text
    PostgreSQL parses): every value comes back as it was, floats to the last bit, NULLs,
    and strings that need quoting in an array."""
    from trainguard.backend.ingest.statements import _array_literal

    floats = [1796358315.1234567, -0.0, 1e-300, 2.5e300, None, float("inf"), 0.1 + 0.2]
    texts = ["bench0123456789", 'a"b', "c\\d", "e,f", "{g}", "NULL", "", " h ", None]
    ints = [1, -(2**40), 0, None, 2**62]
    bools = [True, False, None]
    engine = create_engine(pg_database)
    try:
        with engine.connect() as conn:
            back = conn.exec_driver_sql(
                "SELECT %s::float8[], %s::text[], %s::int8[], %s::bool[], "
                "(%s::float8[])[1] = 'NaN'::float8",
                tuple(_array_literal(v) for v in (floats, texts, ints, bools, [float("nan")])),
            ).one()
    finally:
        engine.dispose()
    assert list(back) == [floats, texts, ints, bools, True]
