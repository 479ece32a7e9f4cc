"""Event data typed by kind (trainguard.protocol.payloads), over real HTTP: a wrongly typed
or out-of-bounds field of any kind is refused with a 422 naming its path and nothing of
the batch is stored; what agents sent before (and keys the backend does not know) is
stored as it came."""

from __future__ import annotations

import time
from typing import Any

import httpx
import msgspec
import pytest
from sqlalchemy import create_engine, select

from tests.support import AUTH
from trainguard.backend.models import Event, IngestBatch
from trainguard.protocol import payloads, wire

T = float(int(time.time()) - 600)

# One bad field per kind that has typed data: (kind, key, value).
BAD = [
    ("xid", "pid", -1),
    ("gpu_lost", "index", 4096),
    ("rank_start", "world_size", 0),
    ("rank_exit", "signal", "KILL"),
    ("exception", "uncaught", "yes"),
    ("hang", "stalled_s", -3.0),
    ("heartbeat_lost", "age_s", "10 s"),
    ("straggler", "flagged", 1),
    ("checkpoint", "phase", "s" * 65),
    ("restart", "attempt", -1),
    ("command", "command_id", "c" * 65),
    ("spool_gap", "from", "yesterday"),
    ("agent_start", "interval", -1.0),
    ("timeouts", "shorter_s", "10 s"),
]


def body(*events: dict[str, Any], seq: int = 1) -> dict[str, Any]:
    return {"node": "n1", "agent_id": "agent000001", "seq": seq, "sent_at": T, "events": events}


def stored(db_url: str) -> tuple[list[dict[str, Any]], int]:
    engine = create_engine(db_url)
    with engine.connect() as conn:
        data = [dict(d) for d in conn.execute(select(Event.data).order_by(Event.id)).scalars()]
        batches = len(conn.execute(select(IngestBatch.seq)).all())
    engine.dispose()
    return data, batches


def post(url: str, content: dict[str, Any], msgpack: bool = False) -> httpx.Response:
    encode = msgspec.msgpack.encode if msgpack else msgspec.json.encode
    kind = wire.MSGPACK_TYPE if msgpack else wire.JSON_TYPE
    headers = {**AUTH, "Content-Type": kind}
    return httpx.post(f"{url}/api/v1/ingest", content=encode(content), headers=headers, timeout=10)


def test_every_kind_but_log_has_a_struct() -> None:
    kinds = set(wire.EventKind.__args__)  # type: ignore[attr-defined]  # a Literal's values
    assert kinds - set(payloads.EVENT_DATA) == {"log"}
    assert {k for k, _, _ in BAD} == set(payloads.EVENT_DATA)


@pytest.mark.parametrize(("kind", "key", "value"), BAD, ids=[k for k, _, _ in BAD])
def test_a_bad_field_of_each_kind_is_refused_naming_it(
    live_url: str, db_url: str, kind: str, key: str, value: Any
) -> None:
    good = {"kind": "log", "ts": T, "message": "fine"}
    bad = {"kind": kind, "ts": T, "data": {"source": "kmsg", key: value}}
    r = post(live_url, body(good, bad))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert f"- at `$.events[1].data.{key}`" in detail, detail
    assert f"in {kind} data" in detail, detail
    assert stored(db_url) == ([], 0)  # nothing of the batch, not even the good event


def test_a_bad_field_in_a_msgpack_body_is_named_the_same(live_url: str, db_url: str) -> None:
    bad = {"kind": "rank_exit", "ts": T, "job": "j", "rank": 0, "data": {"exit_code": 1.5}}
    r = post(live_url, body(bad), msgpack=True)
    assert r.status_code == 422, r.text
    assert "got `float`, in rank_exit data - at `$.events[0].data.exit_code`" in r.text
    assert stored(db_url) == ([], 0)


# What agents and tests sent before the data had types, stored as it came.
OLD = [
    ("rank_exit", {"signal": 9}),
    ("rank_exit", {"exit_code": 0, "clean": True}),
    ("rank_exit", {"signal": 15, "clean": False, "stop_signal": 15, "launcher_exited": True}),
    ("rank_exit", {"clean": False, "reaped": True, "uncaught": "RuntimeError"}),
    ("rank_exit", {"exit_code": -1, "said": "sys.exit(-1)"}),  # an SDK's exit code, any int
    ("xid", {"source": "kmsg", "action": "RESET_GPU", "pci": "0000:18:00", "pid": 77}),
    ("xid", {"recovery_action": "NODE_REBOOT"}),
    ("xid", {"recovery_action": 2}),
    ("checkpoint", {"phase": "save_end", "step": 40, "ok": True, "blocking_s": 1.5}),
    ("checkpoint", {"phase": "save", "step": -1, "blocking_s": -0.2}),  # a script's own step
    ("exception", {"step": 47}),
    ("spool_gap", {"samples": 8, "events": 0, "steps": 0, "batches": 1, "from": None, "to": T}),
    ("spool_gap", {"records": 3, "where": "outbox"}),
    ("agent_start", {"version": "0.1", "source": "nvml", "agent_id": "a" * 32, "pid": 7}),
    ("restart", {"level": "in_process", "iteration": 2, "previous": 1}),
    ("log", {"index": "three", "pid": "not a pid", "anything": 1.5}),  # free-form
    ("hang", {"pid": 5, "stalled_s": 61.0, "a_newer_key": "kept"}),  # a key not listed
]


def test_what_agents_sent_before_is_stored_as_it_came(live_url: str, db_url: str) -> None:
    events = [{"kind": k, "ts": T + i, "data": d} for i, (k, d) in enumerate(OLD)]
    r = post(live_url, body(*events))
    assert r.status_code == 200, r.text
    assert r.json()["stored_events"] == len(OLD)
    assert stored(db_url) == ([d for _, d in OLD], 1)
    r = post(live_url, body(*events, seq=2), msgpack=True)
    assert r.status_code == 200, r.text


def test_typed_data_reads_the_keys_by_their_wire_names() -> None:
    ev = wire.Event(kind="spool_gap", ts=T, data={"from": T - 5, "to": T, "samples": 8})
    gap = ev.typed_data()
    assert isinstance(gap, payloads.SpoolGapData)
    assert (gap.start, gap.end, gap.samples, gap.events) == (T - 5, T, 8, None)
    assert gap.wire() == {"from": T - 5, "to": T, "samples": 8}
