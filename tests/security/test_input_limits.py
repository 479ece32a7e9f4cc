"""Input limits: each violation is a 4xx whose message says what is wrong, nothing of the
refused request is stored, and what was stored before stays (SQLite and PostgreSQL)."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest
from sqlalchemy import create_engine, func, select

from trainguard.backend.models import Event, IngestBatch, Sample, Step
from trainguard.protocol import wire

DAY = 86400.0


def body(**over: Any) -> dict[str, Any]:
    now = time.time()
    b: dict[str, Any] = {
        "node": "n1",
        "agent_id": "agent000001",
        "seq": 1,
        "sent_at": now,
        "samples": [{"uuid": "GPU-n1-0", "ts": now, "util": 50.0}],
        "events": [{"kind": "log", "ts": now, "message": "hello"}],
        "steps": [{"job": "job-1", "rank": 0, "step": 1, "start": now - 1, "end": now}],
        "ranks": [{"job": "job-1", "rank": 0, "pid": 4242}],
    }
    b.update(over)
    return b


def rows(url: str) -> dict[str, int]:
    engine = create_engine(url)
    with engine.connect() as conn:
        out = {
            m.__tablename__: int(conn.execute(select(func.count()).select_from(m)).scalar_one())
            for m in (IngestBatch, Sample, Event, Step)
        }
    engine.dispose()
    return out


@pytest.fixture
def stored(client: Any, db_url: str) -> dict[str, int]:
    """One batch already stored: every refusal below must leave it as it is."""
    r = client.post("/api/v1/ingest", json=body())
    assert r.status_code == 200, r.text
    return rows(db_url)


def sample(ts: float | None = None, **kw: Any) -> dict[str, Any]:
    return {"uuid": "GPU-n1-0", "ts": time.time() if ts is None else ts, **kw}


def step(**kw: Any) -> dict[str, Any]:
    now = time.time()
    return {"job": "job-1", "rank": 0, "step": 2, "start": now - 1, "end": now, **kw}


# (case, body changes, status, words the message must contain)
REFUSED = [
    ("unknown top-level field", {"extra": 1}, 422, "Object contains unknown field `extra`"),
    (
        "unknown sample field",
        {"samples": [sample(fan_rpm=1)]},
        422,
        "unknown field `fan_rpm` - at `$.samples[0]`",
    ),
    ("node name too long", {"node": "n" * 129}, 422, "length <= 128 - at `$.node`"),
    ("node name with a slash", {"node": "a/b"}, 422, "at `$.node`"),
    ("empty node name", {"node": ""}, 422, "at `$.node`"),
    ("short agent id", {"agent_id": "abc"}, 422, "at `$.agent_id`"),
    ("seq zero", {"seq": 0}, 422, "at `$.seq`"),
    ("uuid too long", {"samples": [{"uuid": "G" * 97, "ts": 1e9}]}, 422, "$.samples[0].uuid"),
    (
        "event message too long",
        {"events": [{"kind": "log", "ts": 1e9, "message": "m" * 4097}]},
        422,
        "length <= 4096 - at `$.events[0].message`",
    ),
    (
        "too many event data keys",
        {"events": [{"kind": "log", "ts": 1e9, "data": {f"k{i}": i for i in range(65)}}]},
        422,
        "$.events[0].data",
    ),
    ("unknown event kind", {"events": [{"kind": "reboot", "ts": 1e9}]}, 422, "$.events[0].kind"),
    ("utilisation over 100", {"samples": [sample(util=101.0)]}, 422, "$.samples[0].util"),
    ("negative power", {"samples": [sample(power_w=-1.0)]}, 422, "$.samples[0].power_w"),
    ("a string for a number", {"samples": [sample(temp_c="hot")]}, 422, "$.samples[0].temp_c"),
    (
        "too many samples",
        {"samples": [sample() for _ in range(wire.MAX_SAMPLES + 1)]},
        422,
        f"length <= {wire.MAX_SAMPLES} - at `$.samples`",
    ),
    (
        "too many GPUs",
        {"gpus": [{"uuid": f"G{i}", "index": i % 1024} for i in range(wire.MAX_GPUS + 1)]},
        422,
        "$.gpus",
    ),
    # Time: beyond the 1-day bound ahead of the server's clock (2 days: these cases are
    # built at collection, minutes before they run), or older than the spool could hold.
    (
        "sample a day ahead",
        {"samples": [sample(time.time() + 2 * DAY)]},
        422,
        "timestamp too far in the future - at `$.samples[0].ts`",
    ),
    (
        "event a day ahead",
        {"events": [{"kind": "log", "ts": time.time() + 2 * DAY}]},
        422,
        "timestamp too far in the future - at `$.events[0].ts`",
    ),
    (
        "step ending a day ahead",
        {"steps": [step(end=time.time() + 2 * DAY)]},
        422,
        "timestamp too far in the future - at `$.steps[0].end`",
    ),
    (
        "heartbeat a day ahead",
        {"ranks": [{"job": "j", "rank": 0, "pid": 1, "last_heartbeat": time.time() + 2 * DAY}]},
        422,
        "timestamp too far in the future - at `$.ranks[0].last_heartbeat`",
    ),
    (
        "sent a day ahead",
        {"sent_at": time.time() + 2 * DAY},
        422,
        "timestamp too far in the future - at `$.sent_at`",
    ),
    (
        "sample from 1970 (a reset clock)",
        {"samples": [sample(1.0)]},
        422,
        "timestamp too far in the past - at `$.samples[0].ts`",
    ),
    (
        "step older than 7 days",
        {"steps": [step(start=time.time() - 8 * DAY, end=time.time() - 8 * DAY + 1)]},
        422,
        "timestamp too far in the past - at `$.steps[0].start`",
    ),
    # Integers beyond what the database columns hold.
    ("seq beyond int64", {"seq": 2**63}, 422, "out of range - at `$.seq`"),
    ("pid beyond int32", {"ranks": [{"job": "j", "rank": 0, "pid": 2**31}]}, 422, "$.ranks[0].pid"),
    (
        "step beyond int32",
        {"steps": [step(step=2**31)]},
        422,
        "out of range - at `$.steps[0].step`",
    ),
    (
        "attempt beyond int32",
        {"steps": [step(attempt=2**31)]},
        422,
        "out of range - at `$.steps[0].attempt`",
    ),
    (
        "remapped rows beyond int32",
        {"samples": [sample(remapped_correctable=2**31)]},
        422,
        "$.samples[0].remapped_correctable",
    ),
]


def test_each_bad_batch_is_refused_with_a_message_and_nothing_stored(
    client: Any, db_url: str, stored: dict[str, int]
) -> None:
    failures = []
    for case, change, status, words in REFUSED:
        r = client.post("/api/v1/ingest", json=body(**{"seq": 2, **change}))
        detail = str(r.json().get("detail"))
        if r.status_code != status or words not in detail:
            failures.append(f"{case}: {r.status_code} {detail}")
    assert failures == []
    assert rows(db_url) == stored


def test_every_32_bit_sample_column_refuses_a_larger_value(
    client: Any, db_url: str, stored: dict[str, int]
) -> None:
    """Binary COPY would wrap a value its int4 column cannot hold: each such reading is
    bounded on the wire, so the batch is refused with the field's path, whatever column
    is added later (the columns come from the model)."""
    from sqlalchemy import BigInteger, Integer

    from trainguard.backend.models import SAMPLE_READINGS

    int32 = [
        c
        for c in SAMPLE_READINGS
        if isinstance(Sample.__table__.c[c].type, Integer)
        and not isinstance(Sample.__table__.c[c].type, BigInteger)
    ]
    assert int32  # remapped rows today
    for i, c in enumerate(int32):
        top = [sample(**{c: 2**31 - 1})]
        ok = client.post("/api/v1/ingest", json=body(seq=10 + 2 * i, samples=top))
        assert ok.status_code == 200, (c, ok.text)
        over = [sample(**{c: 2**31})]
        r = client.post("/api/v1/ingest", json=body(seq=11 + 2 * i, samples=over))
        assert r.status_code == 422 and f"$.samples[0].{c}" in r.json()["detail"], (c, r.text)
    assert rows(db_url)["samples"] == stored["samples"] + len(int32)


def test_old_data_within_the_spool_horizon_is_accepted(client: Any, db_url: str) -> None:
    """An agent replays what it spooled while the backend was away: six days late is fine."""
    old = time.time() - 6 * DAY
    r = client.post(
        "/api/v1/ingest",
        json=body(
            sent_at=old,
            samples=[sample(old)],
            events=[{"kind": "xid", "ts": old, "xid": 79}],
            steps=[step(start=old - 1, end=old)],
        ),
    )
    assert r.status_code == 200, r.text
    assert rows(db_url)["samples"] == 1
    # Skew up to a day ahead is recorded, not refused.
    ahead = time.time() + DAY - 600
    r = client.post("/api/v1/ingest", json=body(seq=2, sent_at=ahead, samples=[sample(ahead)]))
    assert r.status_code == 200, r.text
    node = client.get("/api/v1/nodes/n1").json()
    assert node["clock_offset_s"] == pytest.approx(DAY - 600, abs=60)


def test_body_size_is_limited_whatever_the_client_declares(make_client: Any, db_url: str) -> None:
    client = make_client(max_body_bytes=4096)
    big = msgspec.json.encode(body(samples=[sample() for _ in range(200)]))
    assert len(big) > 4096
    r = client.post("/api/v1/ingest", content=big)
    assert r.status_code == 413
    assert r.json()["detail"] == f"body of {len(big)} bytes exceeds the limit of 4096"

    def chunks() -> Any:  # no Content-Length: the limit holds while reading
        for i in range(0, len(big), 1000):
            yield big[i : i + 1000]

    r = client.post("/api/v1/ingest", content=chunks())
    assert r.status_code == 413 and r.json()["detail"] == "body exceeds the limit of 4096 bytes"
    assert rows(db_url)["ingest_batches"] == 0
    assert client.post("/api/v1/ingest", json=body()).status_code == 200


def test_malformed_bodies_are_4xx(client: Any, db_url: str, stored: dict[str, int]) -> None:
    for raw, words in [
        (b"", "malformed JSON"),
        (b"{", "malformed JSON"),
        (b"[]", "invalid batch"),
        (b"\xff", "malformed JSON"),
    ]:
        r = client.post("/api/v1/ingest", content=raw)
        assert r.status_code in (400, 422) and words in r.json()["detail"], (raw, r.text)
    assert rows(db_url) == stored


def test_one_bad_batch_does_not_fail_the_batches_stored_with_it(client: Any, db_url: str) -> None:
    """The writer stores concurrent batches in one transaction. A batch the database
    refuses (here one that skipped the router's checks) must not take its neighbours down
    with it: they are stored, it alone is refused."""
    writer = client.app.state.writer
    now = time.time()

    def decoded(**kw: Any) -> wire.Batch:  # no events: the writer waits for company
        return wire.decode_batch(msgspec.json.encode(body(events=[], **kw)))

    good = [decoded(agent_id=f"agent00000{i}") for i in (1, 2)]
    bad = decoded(agent_id="agent000003", seq=2**63 + 5)
    futures = [writer.submit(b, now) for b in (good[0], bad, good[1])]
    ok0, refused, ok1 = (f.exception(timeout=30) for f in futures)
    assert ok0 is None and ok1 is None
    assert refused is not None
    assert rows(db_url)["ingest_batches"] == 2 and rows(db_url)["samples"] == 2


# --- the other request bodies (pydantic models with extra="forbid") ------------------------


def test_operator_and_agent_bodies_refuse_unknown_fields_and_long_strings(client: Any) -> None:
    assert client.post("/api/v1/ingest", json=body()).status_code == 200
    cases = [
        ("/api/v1/nodes/n1/cordon", {"reason": "x", "drain": True}, "drain"),
        ("/api/v1/nodes/n1/cordon", {"reason": "r" * 501}, "reason"),
        ("/api/v1/jobs/job-1/restarts", {"level": "reboot", "reason": "x"}, "level"),
        ("/api/v1/jobs/job-1/restarts", {"level": "launcher"}, "reason"),
        ("/api/v1/jobs/job-1/restarts", {"level": "launcher", "reason": ""}, "reason"),
        ("/api/v1/incidents/1/approve", {"reason": "x", "level": "stop_job"}, "level"),
        ("/api/v1/commands/c1/acks", {"phase": "done", "ts": 1e9, "node": "n1"}, "phase"),
        ("/api/v1/commands/c1/acks", {"phase": "delivered", "ts": 1e9, "node": "n1", "x": 1}, "x"),
    ]
    for path, payload, field in cases:
        r = client.post(path, json=payload)
        assert r.status_code == 422, (path, payload, r.text)
        assert field in r.json()["detail"], r.json()["detail"]
    assert client.get("/api/v1/nodes/n1").json()["cordoned"] is False


def test_query_and_path_parameters_are_bounded(client: Any) -> None:
    for path, params in [
        ("/api/v1/events", {"limit": 1001}),
        ("/api/v1/events", {"kind": "reboot"}),
        ("/api/v1/events", {"node": "n" * 129}),
        ("/api/v1/gpus/GPU-n1-0/samples", {"points": 5001}),
        ("/api/v1/gpus/GPU-n1-0/samples", {"since": -1}),
        ("/api/v1/jobs/job-1/steps", {"limit": 100_001}),
        ("/api/v1/agents/n1/commands", {"wait": 61}),
        ("/api/v1/incidents", {"status": "exploded"}),
        ("/api/v1/nodes/" + "n" * 129, {}),
    ]:
        r = client.get(path, params=params)
        assert r.status_code == 422, (path, params, r.text)
        assert isinstance(r.json()["detail"], str) and r.json()["detail"]


# Every route whose body is a pydantic model (the agents' routes decode their own).
_JSON_ROUTES = [
    "/api/v1/jobs/job-1/restarts",
    "/api/v1/nodes/n1/cordon",
    "/api/v1/nodes/n1/uncordon",
    "/api/v1/incidents/1/approve",
    "/api/v1/incidents/1/reject",
]


def test_malformed_json_is_a_400_on_every_json_route(client: Any) -> None:
    assert client.post("/api/v1/ingest", json=body()).status_code == 200
    json_type = {"Content-Type": "application/json"}
    for path in [*_JSON_ROUTES, "/api/v1/commands/c1/acks"]:
        r = client.post(path, content=b'{"phase": x', headers=json_type)
        assert r.status_code == 400, (path, r.text)
        assert r.json()["detail"].startswith("malformed JSON: "), (path, r.text)
    assert client.get("/api/v1/nodes/n1").json()["cordoned"] is False


def test_a_json_route_refuses_another_content_type_with_415(client: Any) -> None:
    assert client.post("/api/v1/ingest", json=body()).status_code == 200
    for path in _JSON_ROUTES:
        r = client.post(path, content=b"reason=x", headers={"Content-Type": "text/plain"})
        assert r.status_code == 415, (path, r.text)
        assert r.json()["detail"] == (
            "unsupported content type 'text/plain': send application/json"
        )
    # No Content-Type at all: read as JSON, as ingest and acks read it.
    r = client.post("/api/v1/nodes/n1/cordon", content=b'{"reason": "disk", "force": true}')
    assert r.status_code == 200, r.text
    assert client.get("/api/v1/nodes/n1").json()["cordoned"] is True


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/jobs/my job",
        "/api/v1/jobs/my job/steps",
        "/api/v1/jobs/my job/goodput",
        "/api/v1/jobs/.hidden/stragglers",
        "/api/v1/nodes/bad node",
        "/api/v1/nodes/bad node/gpus",
        "/api/v1/agents/bad node/commands",
    ],
)
def test_a_name_no_agent_can_send_is_a_422_not_a_404(client: Any, path: str) -> None:
    r = client.get(path, params={"wait": 0} if "commands" in path else {})
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith(("path.job: ", "path.node: ")), r.text
    r = client.post("/api/v1/jobs/my job/restarts", json={"level": "launcher", "reason": "x"})
    assert r.status_code == 422 and r.json()["detail"].startswith("path.job: "), r.text
