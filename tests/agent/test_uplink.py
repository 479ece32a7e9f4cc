"""The uplink against an in-process fake backend (httpx.MockTransport) that validates every
body with the real wire decoder. The real-HTTP test against the real backend lives with
the backend tests."""

from __future__ import annotations

import logging
import random
import threading
import time
from email.utils import formatdate
from pathlib import Path

import httpx
import pytest

from trainguard.agent.config import AgentConfig
from trainguard.agent.uplink.outbox import Outbox
from trainguard.agent.uplink.sender import Uplink, next_slot
from trainguard.agent.uplink.spool import Spool
from trainguard.protocol.wire import (
    MAX_BODY_BYTES,
    MAX_SAMPLES,
    MSGPACK_TYPE,
    Batch,
    Event,
    GpuSample,
    LauncherStatus,
    decode_batch,
    decode_batch_msgpack,
)

T0 = 1_700_000_000.0


class Backend:
    """A fake ingest endpoint; `mode` says how it answers."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.batches: list[Batch] = []
        self.requests: list[httpx.Request] = []
        self.received_at = T0 + 3.0
        self.pace: object = None  # batch_interval_s in the answer, when set
        self.launchers = False  # stores Batch.launchers and says so, as a new backend
        self.msgpack = False  # takes MessagePack and says so (Accept-Post), as a new backend
        self.lose: set[int] = set()  # seqs whose answer is lost once (stored, then a timeout)
        self._lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            self.requests.append(request)
        if self.mode == "down":
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if self.mode == "503":
            return httpx.Response(503, json={"detail": "database unavailable"})
        if self.mode == "429":
            return httpx.Response(429, headers={"Retry-After": "7"}, json={"detail": "slow down"})
        if self.mode == "401":
            return httpx.Response(401, json={"detail": "invalid token"})
        if self.mode == "422":
            return httpx.Response(422, json={"detail": "Expected `str` - at `$.node`"})
        if self.mode == "bare":  # an older or proxied backend: no JSON, a Date header
            return httpx.Response(200, headers={"Date": formatdate(T0 + 10, usegmt=True)})
        if request.headers["content-type"] == MSGPACK_TYPE:
            if not self.msgpack:
                return httpx.Response(415, json={"detail": "unsupported content type"})
            b = decode_batch_msgpack(request.content)
        else:
            b = decode_batch(request.content)
        with self._lock:
            duplicate = any((x.agent_id, x.seq) == (b.agent_id, b.seq) for x in self.batches)
            self.batches.append(b)
        if b.seq in self.lose:
            self.lose.discard(b.seq)
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(
            200,
            json={
                "seq": b.seq,
                "duplicate": duplicate,
                "stored_samples": len(b.samples),
                "stored_events": len(b.events),
                "stored_steps": len(b.steps),
                "received_at": self.received_at,
                **({} if self.pace is None else {"batch_interval_s": self.pace}),
                **({"launchers": True} if self.launchers else {}),
            },
            headers={"Accept-Post": f"application/json, {MSGPACK_TYPE}"} if self.msgpack else {},
        )

    def seqs(self) -> list[tuple[str, int]]:
        return [(b.agent_id, b.seq) for b in self.batches]

    def events(self) -> list[Event]:
        return [e for b in self.batches for e in b.events]


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def config(tmp_path: Path, **kw) -> AgentConfig:
    kw.setdefault("interval", 1.0)
    return AgentConfig(
        node="node-1", server="http://backend:8000/", token="tok-1", spool_dir=tmp_path, **kw
    )


def uplink(tmp_path: Path, backend: Backend, outbox: Outbox | None = None, **kw):
    mono = Clock(100.0)
    cfg = config(tmp_path, simulate=kw.pop("simulate", None), interval=kw.pop("interval", 1.0))
    up = Uplink(
        cfg,
        outbox if outbox is not None else Outbox(),
        transport=httpx.MockTransport(backend),
        monotonic=mono,
        clock=lambda: T0,
        rng=random.Random(0),
        backoff_cap_s=kw.pop("backoff_cap_s", 5.0),
        **kw,
    )
    return up, mono


def samples(n: int, t: float = T0) -> list[GpuSample]:
    return [GpuSample(uuid="GPU-a", ts=t + i * 0.001, util=50.0) for i in range(n)]


def tick_each_second(up: Uplink, mono: Clock, seconds: int, per_tick: int) -> None:
    """`seconds` ticks a second apart, each with `per_tick` samples taken at T0 + t."""
    for t in range(seconds):
        up.outbox.put_samples(samples(per_tick, T0 + t))
        up.tick()
        mono.t += 1.0


def test_a_tick_posts_one_batch_with_token_and_identity(tmp_path: Path):
    backend = Backend()
    up, _ = uplink(tmp_path, backend, simulate=2)
    up.outbox.put_samples(samples(3))
    up.tick()
    (req,) = backend.requests
    assert req.url == "http://backend:8000/api/v1/ingest"
    assert req.headers["authorization"] == "Bearer tok-1"
    (b,) = backend.batches
    assert (b.node, b.seq, b.sent_at, b.simulated, len(b.samples)) == ("node-1", 1, T0, True, 3)
    assert b.agent_id == up.agent_id and len(up.agent_id) == 32
    st = up.stats()
    assert (st.batches_sent, st.samples_sent, st.connected) == (1, 3, True)
    assert st.clock_offset_s == pytest.approx(3.0)


def test_without_received_at_the_date_header_hints_the_clock_offset(tmp_path: Path):
    backend = Backend()
    backend.mode = "bare"
    up, _ = uplink(tmp_path, backend)
    up.tick()
    st = up.stats()
    assert st.batches_sent == 1 and st.clock_offset_s == pytest.approx(10.0)


def test_batches_go_as_msgpack_once_the_backend_lists_it_and_as_json_after_a_415(
    tmp_path: Path,
):
    backend = Backend()
    backend.msgpack = True
    up, _ = uplink(tmp_path, backend)
    for n in (2, 3):
        up.outbox.put_samples(samples(n))
        up.tick()
    # The first batch is JSON (nothing known yet); its answer lists MessagePack.
    assert [r.headers["content-type"] for r in backend.requests] == [
        "application/json",
        MSGPACK_TYPE,
    ]
    assert [len(b.samples) for b in backend.batches] == [2, 3]
    backend.msgpack = False  # another backend behind the same address: JSON only
    up.outbox.put_samples(samples(4))
    up.tick()
    assert [r.headers["content-type"] for r in backend.requests[2:]] == [
        MSGPACK_TYPE,
        "application/json",
    ]
    assert [s for _, s in backend.seqs()] == [1, 2, 3]  # the refused one, resent as JSON
    assert len(backend.batches[-1].samples) == 4 and up.msgpack is False
    up.outbox.put_samples(samples(1))
    up.tick()
    assert backend.requests[-1].headers["content-type"] == "application/json"
    assert up.stats().batches_rejected == 0


def test_seq_counts_up_across_ticks_and_splits(tmp_path: Path):
    backend = Backend()
    up, _ = uplink(tmp_path, backend)
    up.outbox.put_samples(samples(MAX_SAMPLES * 2 + 5))
    up.tick()
    up.outbox.put_samples(samples(1))
    up.tick()
    assert [s for _, s in backend.seqs()] == [1, 2, 3, 4]
    assert [len(b.samples) for b in backend.batches] == [MAX_SAMPLES, MAX_SAMPLES, 5, 1]


def test_a_body_over_the_size_limit_is_split(tmp_path: Path):
    backend = Backend()
    up, _ = uplink(tmp_path, backend)
    for i in range(2048):
        up.outbox.put_event(Event(kind="log", ts=T0 + i, message="x" * 4096))
    up.tick()
    assert len(backend.batches) >= 2
    assert sum(len(b.events) for b in backend.batches) == 2048
    assert all(len(r.content) <= MAX_BODY_BYTES for r in backend.requests)


def test_spooled_batches_replay_in_order_when_the_backend_returns(tmp_path: Path):
    backend = Backend()
    up, mono = uplink(tmp_path, backend)
    backend.mode = "down"
    tick_each_second(up, mono, 3, 2)
    # The first batch was sent (it keeps its seq); those never sent share one entry.
    assert backend.batches == [] and len(up.spool) == 2
    st = up.stats()
    assert not st.connected and "ConnectError" in st.last_error and st.backlog == 2
    backend.mode = "ok"
    mono.t += 60  # past any backoff
    up.outbox.put_samples(samples(2, T0 + 10))
    up.tick()
    assert [s for _, s in backend.seqs()] == [1, 2]
    assert [s.ts for b in backend.batches for s in b.samples] == [
        T0 + t + i * 0.001 for t in (0, 1, 2, 10) for i in range(2)
    ]
    assert len(up.spool) == 0 and up.stats().batches_replayed == 2


def test_a_minute_away_replays_in_two_requests_every_sample_once_in_order(tmp_path: Path):
    """60 ticks of 8 samples while the backend is down: the first batch (sent) keeps its
    entry and seq, the 59 never sent are merged into one entry, so the replay takes 2
    requests, not 60 (from every agent of the cluster at the same moment)."""
    backend = Backend()
    up, mono = uplink(tmp_path, backend)
    backend.mode = "down"
    tick_each_second(up, mono, 60, 8)
    assert len(up.spool) == 2 and up.stats().batches_merged == 58
    backend.mode = "ok"
    tried = len(backend.requests)  # the retries during the outage (after each backoff)
    mono.t += 60
    up.tick()
    assert len(backend.requests) - tried == 2 and len(backend.batches) == 2
    assert [len(b.samples) for b in backend.batches] == [8, 59 * 8]
    assert [s.ts for b in backend.batches for s in b.samples] == [
        T0 + t + i * 0.001 for t in range(60) for i in range(8)
    ]
    assert len(up.spool) == 0


def test_merged_entries_stay_under_a_sixteenth_of_the_spool(tmp_path: Path):
    """So that an overflow, which drops the oldest entry, drops a small part of it."""
    backend = Backend()
    spool = Spool(tmp_path / "spool", 64 * 1024)
    up, _ = uplink(tmp_path, backend, spool=spool)
    backend.mode = "down"
    for t in range(100):
        up.outbox.put_samples(samples(8, T0 + t))
        up.tick()
    sizes = [p.stat().st_size for p in (tmp_path / "spool").glob("*.batch")]
    assert len(sizes) > 3 and max(sizes) <= 4096
    assert sum(sizes) > 3 * 4096 // 2  # merged: not a file per tick


def test_a_batch_whose_answer_was_lost_is_never_merged_into(tmp_path: Path):
    """The backend may hold a batch it did not answer: later samples merged under its seq
    would be dropped as a duplicate. They go into an entry of their own."""
    backend = Backend()
    up, mono = uplink(tmp_path, backend)
    backend.mode = "down"
    up.outbox.put_samples(samples(1, T0))
    up.tick()  # seq 1: sent, failed, spooled
    up._retry_at = mono.t + 10
    up.outbox.put_samples(samples(1, T0 + 1))
    up.tick()  # seq 2: never sent
    backend.mode, backend.lose = "ok", {2}
    mono.t += 60
    up.outbox.put_samples(samples(1, T0 + 2))
    up.tick()  # merged into seq 2; the replay stores 1, and 2 without an answer
    assert len(up.spool) == 1
    mono.t += 60
    up.outbox.put_samples(samples(1, T0 + 3))
    up.tick()  # an entry of its own (seq 3: merged records took none); 2 again, then 3
    assert len(up.spool) == 0
    assert [s for _, s in backend.seqs()] == [1, 2, 2, 3]
    first = {b.seq: b for b in reversed(backend.batches)}  # what the backend kept
    assert [s.ts for seq in sorted(first) for s in first[seq].samples] == [
        T0,
        T0 + 1,
        T0 + 2,
        T0 + 3,
    ]


def test_no_retry_before_the_backoff_expires(tmp_path: Path):
    backend = Backend()
    up, mono = uplink(tmp_path, backend)
    backend.mode = "503"
    up.outbox.put_samples(samples(1))
    up.tick()
    assert len(backend.requests) == 1 and len(up.spool) == 1
    backend.mode = "ok"
    up.outbox.put_samples(samples(1))
    up._retry_at = mono.t + 10  # a backoff in force
    up.tick()
    assert len(backend.requests) == 1 and len(up.spool) == 2  # waited; kept the order
    mono.t += 10
    up.tick()
    assert [s for _, s in backend.seqs()] == [1, 2]


def test_429_honours_retry_after(tmp_path: Path):
    backend = Backend()
    up, mono = uplink(tmp_path, backend)
    backend.mode = "429"
    up.outbox.put_samples(samples(1))
    up.tick()
    assert up._retry_at >= mono.t + 7 and len(up.spool) == 1


def test_agents_refused_together_come_back_spread_over_the_backoff_after_retry_after(
    tmp_path: Path,
):
    """Retry-After is the earliest retry, the agent's jitter comes on top: the agents an
    overloaded backend refused in one second must not all come back in one second."""
    backend = Backend()
    backend.mode = "429"  # Retry-After: 7
    waits = []
    for i in range(20):
        up, mono = uplink(tmp_path / str(i), backend, backoff_base_s=4.0)
        up.rng = random.Random(i)
        up.outbox.put_samples(samples(1))
        up.tick()
        waits.append(up._retry_at - mono.t)
    assert all(7.0 <= w <= 7.0 + 4.0 for w in waits)
    assert max(waits) - min(waits) > 2.0  # spread over the backoff, not all at 7 s


def test_a_permanent_4xx_drops_that_batch_once_with_the_server_message(tmp_path, caplog):
    backend = Backend()
    up, _ = uplink(tmp_path, backend)
    backend.mode = "422"
    up.outbox.put_samples(samples(1))
    with caplog.at_level(logging.ERROR, logger="trainguard.agent.uplink.sender"):
        up.tick()
    assert len(backend.requests) == 1 and len(up.spool) == 0
    assert up.stats().batches_rejected == 1
    (line,) = [r.getMessage() for r in caplog.records]
    assert "422" in line and "Expected `str` - at `$.node`" in line
    backend.mode = "ok"
    up.outbox.put_samples(samples(1))
    up.tick()
    assert backend.seqs() == [(up.agent_id, 2)]


def test_a_bad_token_keeps_the_data_for_when_it_is_fixed(tmp_path: Path):
    backend = Backend()
    up, mono = uplink(tmp_path, backend)
    backend.mode = "401"
    up.outbox.put_samples(samples(1))
    up.tick()
    assert len(up.spool) == 1 and "check the agent token" in up.stats().last_error
    backend.mode = "ok"
    mono.t += 60
    up.tick()
    assert [s for _, s in backend.seqs()] == [1]


def test_batches_of_a_previous_agent_process_are_sent_first(tmp_path: Path):
    backend = Backend()
    old, _ = uplink(tmp_path, backend)
    backend.mode = "down"
    for _ in range(2):
        old.outbox.put_samples(samples(1))
        old.tick()
    old.close()
    backend.mode = "ok"
    new, _ = uplink(tmp_path, backend)
    assert new.agent_id != old.agent_id
    new.outbox.put_samples(samples(1))
    new.tick()
    assert backend.seqs() == [(old.agent_id, 1), (old.agent_id, 2), (new.agent_id, 1)]


def test_a_spool_overflow_is_reported_as_spool_gap_after_reconnecting(tmp_path: Path):
    backend = Backend()
    batch_size = 50 * len(b'{"uuid":"GPU-a","ts":1700000000.001,"util":50.0},')
    spool = Spool(tmp_path, batch_size * 3)
    up, mono = uplink(tmp_path / "unused", backend, spool=spool)
    backend.mode = "down"
    for t in range(6):
        up.outbox.put_samples(samples(50, T0 + t))
        up.tick()
    backend.mode = "ok"
    mono.t += 60
    up.tick()  # replays what is left and queues the report
    up.tick()
    (gap,) = [e for e in backend.events() if e.kind == "spool_gap"]
    assert gap.data["samples"] >= 150 and gap.data["from"] == T0
    assert up.stats().records_dropped == gap.data["samples"]


def test_outbox_overflow_is_reported_too(tmp_path: Path):
    backend = Backend()
    up, _ = uplink(tmp_path, backend, outbox=Outbox(max_records=5))
    up.outbox.put_samples(samples(8))
    up.tick()
    (b,) = backend.batches
    assert len(b.samples) == 5
    (gap,) = b.events
    assert gap.kind == "spool_gap" and gap.data == {"records": 3, "where": "outbox"}


def test_an_invalid_record_is_dropped_not_the_batch(tmp_path: Path):
    backend = Backend()
    up, _ = uplink(tmp_path, backend)
    up.outbox.put_samples([GpuSample(uuid="GPU-a", ts=T0, util=150.0), *samples(2)])
    up.outbox.put_event(Event(kind="log", ts=T0, job="bad job name!"))
    up.tick()
    (b,) = backend.batches
    assert len(b.samples) == 2 and b.events == []
    assert up.stats().records_invalid == 2


def test_an_urgent_event_is_sent_before_the_next_tick(tmp_path: Path, wait_for):
    backend = Backend()
    outbox = Outbox()
    up = Uplink(config(tmp_path, interval=3600), outbox, transport=httpx.MockTransport(backend))
    up.start()
    try:
        wait_for(lambda: backend.batches, what="the first (heartbeat) batch")
        outbox.put_event(Event(kind="xid", ts=time.time(), xid=79), urgent=True)
        wait_for(lambda: any(e.xid == 79 for e in backend.events()), what="the urgent xid")
    finally:
        up.stop()
    assert [s for _, s in backend.seqs()] == list(range(1, len(backend.batches) + 1))


def test_stop_flushes_the_outbox_once_and_spools_what_cannot_go(tmp_path: Path):
    backend = Backend()
    outbox = Outbox()
    up = Uplink(config(tmp_path, interval=3600), outbox, transport=httpx.MockTransport(backend))
    outbox.put_samples(samples(4))
    up.stop()  # never started: the flush happens in the caller
    assert sum(len(b.samples) for b in backend.batches) == 4

    backend.mode = "down"
    up2 = Uplink(config(tmp_path, interval=3600), outbox, transport=httpx.MockTransport(backend))
    outbox.put_samples(samples(4))
    up2.start()
    up2.stop()
    assert len(up2.spool) == 1 and len(list(tmp_path.glob("*.batch"))) == 1


def test_a_graceful_stop_says_goodbye_in_the_last_batch_and_never_spools_it(tmp_path: Path):
    backend = Backend()
    outbox = Outbox()
    up = Uplink(config(tmp_path, interval=3600), outbox, transport=httpx.MockTransport(backend))
    up.going_away = "SIGTERM: the agent is stopping"
    up.stop()  # an empty outbox still sends the goodbye
    (b,) = backend.batches
    assert b.going_away == "SIGTERM: the agent is stopping" and b.samples == []

    backend.mode = "down"  # the goodbye that cannot go is spooled without it
    up2 = Uplink(config(tmp_path, interval=3600), outbox, transport=httpx.MockTransport(backend))
    outbox.put_samples(samples(2))
    up2.going_away = "SIGINT: the agent is stopping"
    up2.stop()
    backend.mode = "ok"
    up3 = Uplink(config(tmp_path, interval=3600), outbox, transport=httpx.MockTransport(backend))
    up3.tick()
    replayed = backend.batches[-1]
    assert len(replayed.samples) == 2 and replayed.going_away is None


def test_the_backends_pace_sets_the_batch_interval_within_bounds(tmp_path: Path):
    backend = Backend()
    up, _ = uplink(tmp_path, backend, interval=1.0)
    up.tick()
    assert up.batch_interval() == 1.0  # an answer without a pace: the sampling interval
    for pace, expected in ((4.0, 4.0), (0.2, 1.0), (1e9, 60.0), (True, 60.0), ("9", 60.0)):
        backend.pace = pace
        up.outbox.put_samples(samples(1))
        up.tick()
        assert up.batch_interval() == expected, pace  # a bool or a string changes nothing


def test_a_paced_uplink_sends_fewer_larger_batches_and_loses_no_sample(tmp_path: Path, wait_for):
    """Sampling every 20 ms, told to batch every 0.5 s: the samples arrive in a few
    batches; the same uplink without a pace, in the same run, sends many more."""

    def run(pace: float | None, where: Path) -> tuple[int, int]:
        backend = Backend()
        backend.pace = pace
        outbox = Outbox()
        up = Uplink(config(where, interval=0.02), outbox, transport=httpx.MockTransport(backend))
        up.start()
        try:
            wait_for(lambda: backend.batches, what="the first batch")
            for i in range(60):
                outbox.put_samples(samples(1, T0 + i))
                time.sleep(0.02)
        finally:
            up.stop()
        got = sum(len(b.samples) for b in backend.batches)
        return len(backend.batches), got

    paced, paced_samples = run(0.5, tmp_path / "a")
    free, free_samples = run(None, tmp_path / "b")
    assert paced_samples == free_samples == 60
    assert paced * 3 < free, (paced, free)


def test_a_tick_that_ran_long_skips_the_slots_it_missed_and_keeps_the_agents_phase():
    """Agents whose batches an overloaded backend answered in one burst keep their own
    phases: each one's next tick is at its next slot, not 'now', so their schedules do not
    fall into step (100.0 and 103.5: still 3.5 s apart after both answers came at 123.2)."""
    assert next_slot(108.0, 8.0, 101.0) == 108.0  # on time: the next slot
    assert next_slot(108.0, 8.0, 123.2) == 124.0  # 108 and 116 missed, no burst of them
    assert next_slot(111.5, 8.0, 123.2) == 127.5
    assert next_slot(108.0, 8.0, 124.0) == 124.0  # a slot that is due now is kept
    assert next_slot(108.0, 8.0, 124.000001) == 132.0


def test_after_a_slow_answer_the_uplink_ticks_on_its_old_phase(tmp_path: Path, wait_for):
    """Ticks every 0.4 s from the first; the third batch's answer takes 1.0 s. The ticks
    after it fall on the first tick's grid again (0.4 s apart from it), where an uplink
    that restarted its schedule when the slow answer came would tick 0.2 s off it."""

    class Slow(Backend):
        def __init__(self) -> None:
            super().__init__()
            self.sent: list[float] = []

        def __call__(self, request: httpx.Request) -> httpx.Response:
            self.sent.append(time.monotonic())
            if len(self.sent) == 3:
                time.sleep(1.0)
            return super().__call__(request)

    backend = Slow()
    outbox = Outbox()
    up = Uplink(config(tmp_path, interval=0.4), outbox, transport=httpx.MockTransport(backend))
    stop = threading.Event()

    def feed() -> None:
        i = 0
        while not stop.is_set():
            outbox.put_samples(samples(1, T0 + i))
            i += 1
            time.sleep(0.05)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    up.start()
    try:
        wait_for(lambda: len(backend.sent) >= 8, timeout=30, what="eight batches")
    finally:
        stop.set()
        up.stop()
        feeder.join()
    first = backend.sent[0]
    after = backend.sent[4:8]  # the 4th went when the slow answer came: the missed slot
    offsets = [((t - first) + 0.2) % 0.4 - 0.2 for t in after]  # from the grid, in (-0.2, 0.2]
    assert all(abs(o) < 0.08 for o in offsets), [round(o, 3) for o in offsets]


def test_launchers_go_only_to_a_backend_that_stores_them_and_are_never_replayed(
    tmp_path: Path,
):
    backend = Backend()
    up, mono = uplink(tmp_path, backend)
    spare = [LauncherStatus(job="job", pid=42, state="spare", launcher="torchrun")]
    asked: list[bool] = []

    def provider(force: bool) -> list[LauncherStatus] | None:
        asked.append(force)
        return spare

    up.outbox.launchers_provider = provider
    up.outbox.put_samples(samples(1))
    up.tick()  # an older backend: no list asked for, so none sent (it would refuse it)
    assert asked == [] and backend.batches[-1].launchers is None
    backend.launchers = True
    up.outbox.put_samples(samples(1))
    up.tick()  # the answer before said nothing: still none
    up.outbox.put_samples(samples(1))
    up.tick()
    assert asked == [False] and backend.batches[-1].launchers == spare
    backend.mode = "503"
    up.outbox.put_samples(samples(1))
    up.tick()  # refused: spooled without its list, which goes again with the next batch
    assert asked == [False, False]
    assert len(up.spool) == 1
    backend.mode = "ok"
    mono.t += 60
    up.outbox.put_samples(samples(1))
    up.tick()  # the spool goes first, in order: this tick's batch too, still without it
    assert len(up.spool) == 0 and asked == [False, False, True]
    assert [b.launchers for b in backend.batches if b.seq >= 4] == [None, None]
    up.outbox.put_samples(samples(1))
    up.tick()  # the link is back: the current list goes at once
    assert asked[-1] is True and backend.batches[-1].launchers == spare
