"""The uplink: drains the outbox into batches and POSTs them to the backend.

One thread ticks every `interval` on a monotonic clock without drift (or every
`batch_interval_s` when the backend's answers ask for fewer, larger batches: a large
cluster's backend paces its agents), or at once when an urgent event arrives. Batches are
numbered (agent_id, seq) so the backend can drop duplicates. While the backend is
unreachable (connection error, 408/429/5xx, bad token) batches go to the on-disk spool and
are replayed oldest first when it answers again, after exponential backoff with full
jitter; the batches of an outage that were never sent share one spool entry
(`_spool_unsent`), so the replay takes a few requests. Any other 4xx refuses that batch for
good:
it is logged once with the server's message and dropped.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
import random
import threading
import time
import uuid
from dataclasses import dataclass, replace
from email.utils import parsedate_to_datetime
from importlib import metadata
from typing import Any

import httpx
import msgspec

from trainguard.agent.config import AgentConfig
from trainguard.agent.uplink.batches import BODY_LIMIT, Part, merged, split_to_limits, valid_records
from trainguard.agent.uplink.outbox import Drained, Outbox
from trainguard.agent.uplink.spool import Spool, SpoolEntry
from trainguard.protocol.wire import (
    JSON_TYPE,
    MAX_EVENTS,
    MAX_GPUS,
    MAX_RANKS,
    MAX_SAMPLES,
    MAX_STEPS,
    MSGPACK_TYPE,
    Batch,
    Event,
    GpuInfo,
    GpuSample,
    RankStatus,
    StepReport,
    decode_batch,
    encode,
    encode_msgpack,
)

log = logging.getLogger(__name__)

INGEST_PATH = "/api/v1/ingest"
HEARTBEAT_S = 10.0  # an empty batch when nothing was sent for this long
MIN_URGENT_GAP_S = 0.02  # urgent ticks no closer than this (a flood of urgent events)
MAX_SERVER_INTERVAL_S = 60.0  # a backend's batch_interval_s is capped here


def next_slot(due: float, interval: float, now: float) -> float:
    """The first of due, due + interval, due + 2 interval, ... not before `now`. A tick
    that ran long (a slow answer, a replay) skips the slots it missed, with no burst of
    catch-up ticks, and keeps the agent's phase. Restarted from the moment it ended, the
    schedule of every agent that an overloaded backend answered in one burst would be
    in step with the others' from then on: the fleet's batches would reach the backend in
    waves of the interval and keep it overloaded (docs/benchmarks.md, "The load's
    phase")."""
    if due >= now:
        return due
    return due + math.ceil((now - due) / interval) * interval


def agent_version() -> str:
    try:
        return metadata.version("trainguard")
    except metadata.PackageNotFoundError:
        return "0"


class Outcome(enum.Enum):
    SENT = "sent"
    TRANSIENT = "transient"  # keep it, retry later
    REJECTED = "rejected"  # the server refuses this batch for good
    UNSUPPORTED = "unsupported"  # 415 to a MessagePack body: send it again as JSON


@dataclass
class UplinkStats:
    batches_sent: int = 0
    samples_sent: int = 0
    events_sent: int = 0
    steps_sent: int = 0
    duplicates: int = 0
    batches_spooled: int = 0
    batches_merged: int = 0  # batches of an outage spooled into the newest unsent entry
    batches_replayed: int = 0
    batches_rejected: int = 0
    records_invalid: int = 0
    records_dropped: int = 0  # outbox overflow and spool overflow, as reported in spool_gap
    backlog: int = 0  # batches waiting in the spool
    connected: bool = False
    last_error: str = ""
    last_error_at: float | None = None
    last_sent_at: float | None = None
    clock_offset_s: float | None = None  # server clock minus ours (positive: we are behind)


# --- the uplink -------------------------------------------------------------------------


class Uplink:
    """Sends the outbox to `{server}/api/v1/ingest`; `transport` is injectable for tests."""

    def __init__(
        self,
        config: AgentConfig,
        outbox: Outbox,
        transport: httpx.BaseTransport | None = None,
        spool: Spool | None = None,
        *,
        clock: Any = time.time,
        monotonic: Any = time.monotonic,
        rng: random.Random | None = None,
        backoff_base_s: float = 0.5,
        backoff_cap_s: float = 30.0,
        timeout_s: float = 10.0,
    ) -> None:
        self.config, self.outbox = config, outbox
        self.spool = spool if spool is not None else Spool(config.spool_dir, config.spool_max_bytes)
        self.agent_id = uuid.uuid4().hex
        self.seq = 0
        self.simulated = config.simulate is not None
        self.clock, self.monotonic = clock, monotonic
        self.rng = rng or random.Random()
        self.backoff_base_s, self.backoff_cap_s = backoff_base_s, backoff_cap_s
        self._stats = UplinkStats()
        self._attempt = 0
        self._retry_at = 0.0
        self._last_batch_mono = float("-inf")
        # The newest spool entry and its batch while that batch was never sent: later
        # batches of an outage are merged into it (_spool_unsent).
        self._unsent: tuple[SpoolEntry, Batch] | None = None
        self._server_interval = 0.0  # the backend's pace (batch_interval_s), once told
        # New batches go as MessagePack once the backend's answers list it in Accept-Post
        # (older backends read JSON only); spooled bodies replay as the JSON they were.
        self.msgpack = False
        self._logged: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        # Set before stop() on a graceful stop: the final batch says "going away".
        self.going_away: str | None = None
        self.client = httpx.Client(
            base_url=config.server,
            transport=transport,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 3.0)),
            headers={
                "Authorization": f"Bearer {config.token}",
                "Content-Type": "application/json",
                "User-Agent": f"trainguard-agent/{agent_version()}",
            },
        )

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="uplink", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the loop; it flushes the outbox once and spools what it cannot send."""
        if self._closed:
            return
        self._stop.set()
        self.outbox.urgent.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("uplink did not stop within %.0f s", timeout)
        else:
            self.tick(final=True)
            self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.client.close()
            self.spool.close()

    def stats(self) -> UplinkStats:
        return replace(self._stats, backlog=len(self.spool))

    def batch_interval(self) -> float:
        """Seconds between regular batches: the sampling interval, or the backend's pace
        when it asks for fewer, larger batches (`batch_interval_s` in its answers)."""
        return max(self.config.interval, self._server_interval)

    def _run(self) -> None:
        next_t = self.monotonic()
        try:
            while not self._stop.is_set():
                now = self.monotonic()
                if self.outbox.urgent.wait(max(0.0, next_t - now)):
                    if self._stop.is_set():
                        break
                else:
                    interval = self.batch_interval()
                    next_t = next_slot(next_t + interval, interval, now)
                try:
                    self.tick()
                except Exception:  # never let one bad tick end the uplink
                    log.exception("uplink tick failed")
                self._stop.wait(MIN_URGENT_GAP_S)
            self.tick(final=True)
        finally:
            self.close()

    # --- one tick -------------------------------------------------------------------------

    def tick(self, final: bool = False) -> None:
        """Drain the outbox into batches; send them (or spool them); replay the spool."""
        parts = self._drain()
        goodbye = self.going_away if final else None
        if not parts and (goodbye or not len(self.spool)):
            if not goodbye and (self.monotonic() - self._last_batch_mono < HEARTBEAT_S or final):
                return
            parts = [Part([], [], [], None, None)]
        link_down = len(self.spool) > 0 or self.monotonic() < self._retry_at
        for i, part in enumerate(parts):
            if link_down:
                self._spool_unsent(part)
                continue
            batch = self._numbered(part)
            if goodbye and i == len(parts) - 1:
                # The last batch says goodbye (never spooled so: a replay by the next
                # agent would mark its node as gone while it runs).
                batch = msgspec.structs.replace(batch, going_away=goodbye)
            outcome = self._send(batch, timeout=2.0 if final else None)
            if outcome is Outcome.TRANSIENT:
                self._spool(msgspec.structs.replace(batch, going_away=None))
                link_down = True
            elif outcome is Outcome.SENT and i == 0:
                self._report_gap()
        if not final:
            self._replay()

    def _drain(self) -> list[Part]:
        parts: list[Part] = []
        for _ in range(64):  # a bound, so a fast producer cannot hold the tick forever
            d = self.outbox.drain(MAX_SAMPLES, MAX_EVENTS, MAX_STEPS)
            if d.empty() and not d.dropped:
                break
            parts += split_to_limits(self._checked(d))
            full = (
                len(d.samples) == MAX_SAMPLES
                or len(d.events) == MAX_EVENTS
                or len(d.steps) == MAX_STEPS
            )
            if not full:
                break
        return parts

    def _checked(self, d: Drained) -> Part:
        events = list(d.events)
        if d.dropped:
            self._stats.records_dropped += d.dropped
            events.append(self._gap_event({"records": d.dropped, "where": "outbox"}))
        part = Part(
            list(d.samples),
            events,
            list(d.steps),
            d.gpus[:MAX_GPUS] if d.gpus is not None else None,
            d.ranks[:MAX_RANKS] if d.ranks is not None else None,
            d.launchers,
        )
        try:
            decode_batch(encode(part.batch(self.config.node, self.agent_id, 1, 0.0, False)))
            return part
        except msgspec.ValidationError:
            pass
        errors: list[str] = []
        part = Part(
            valid_records(part.samples, GpuSample, errors),
            valid_records(part.events, Event, errors),
            valid_records(part.steps, StepReport, errors),
            valid_records(part.gpus, GpuInfo, errors) if part.gpus is not None else None,
            valid_records(part.ranks, RankStatus, errors) if part.ranks is not None else None,
            # the watch builds them through the wire's own types: none is invalid
            part.launchers,
        )
        self._stats.records_invalid += len(errors)
        log.warning("dropped %d invalid records (first: %s)", len(errors), errors[:1])
        return part

    def _numbered(self, part: Part) -> Batch:
        self.seq += 1
        return self._batch(part, self.seq)

    def _batch(self, part: Part, seq: int) -> Batch:
        return part.batch(self.config.node, self.agent_id, seq, self.clock(), self.simulated)

    def _merge_limit(self) -> int:
        """The largest body an entry grows to by merging: a sixteenth of the spool, so
        that dropping its oldest entry on overflow drops a small part of what it holds."""
        return min(BODY_LIMIT, self.spool.max_bytes // 16)

    def _spool(self, batch: Batch) -> None:
        """Spool a batch that was sent (the backend may hold it: it keeps its seq)."""
        self._unsent = None
        batch = self._without_launchers(batch)
        if self.spool.put(batch):
            self._stats.batches_spooled += 1

    def _without_launchers(self, batch: Batch) -> Batch:
        """`batch` to spool: its launcher list is left out (replayed after a newer one,
        it would undo it) and the current list goes with the next batch instead."""
        if batch.launchers is None:
            return batch
        self.outbox.launchers_unsent = True
        return msgspec.structs.replace(batch, launchers=None)

    def _spool_unsent(self, part: Part) -> None:
        """Spool records never sent: into the newest entry, under its seq, when that one
        was never sent either (a replay after an outage then takes a request per
        MAX_SAMPLES samples, not one per tick of the outage: 60 for a minute at 1 s, from
        every agent at once). Merged records take no seq of their own, so every seq the
        backend lacks is still a batch the spool dropped."""
        if self._unsent is not None:
            entry, held = self._unsent
            fresh = self._without_launchers(self._batch(part, held.seq))
            both = merged(held, fresh, self._merge_limit())
            if both is not None and (kept := self.spool.replace(entry, both[1])):
                self._unsent = (kept, both[0])
                self._stats.batches_merged += 1
                return
        self._unsent = None
        batch = self._without_launchers(self._numbered(part))
        if spooled := self.spool.put(batch):
            self._unsent = (spooled, batch)
            self._stats.batches_spooled += 1

    def _replay(self) -> None:
        """Send spooled batches oldest first while the backend answers."""
        resumed = False
        while not self._stop.is_set() and self.monotonic() >= self._retry_at:
            entry = self.spool.oldest()
            if entry is None:
                break
            if self._unsent is not None and self._unsent[0] == entry:
                self._unsent = None  # sent from now on: the backend may hold its seq
            body = self.spool.read(entry)
            if body is None:
                continue
            try:
                batch: Batch | None = decode_batch(body)
            except (msgspec.DecodeError, msgspec.ValidationError):
                batch = None  # sent as it is: the server's 4xx says what is wrong with it
            outcome = self._post(body, batch)
            if outcome is Outcome.TRANSIENT:
                return
            self.spool.remove(entry)
            if outcome is Outcome.SENT:
                self._stats.batches_replayed += 1
                resumed = True
        if resumed and not len(self.spool):
            log.info("spool replayed; backend up to date")
        if resumed:
            self._report_gap()

    def _report_gap(self) -> None:
        gap = self.spool.take_gap()
        if gap is None:
            return
        self._stats.records_dropped += gap.samples + gap.events + gap.steps
        log.warning(
            "spool overflowed: %d batches (%d samples) were dropped", gap.batches, gap.samples
        )
        self.outbox.put_event(self._gap_event(gap.event_data()))

    def _gap_event(self, data: dict[str, Any]) -> Event:
        text = ", ".join(f"{k}={v}" for k, v in data.items())
        return Event(
            kind="spool_gap", ts=self.clock(), message=f"agent dropped data: {text}", data=data
        )

    # --- HTTP -----------------------------------------------------------------------------

    def _send(self, batch: Batch, timeout: float | None = None) -> Outcome:
        """POST a new batch, as MessagePack when the backend takes it: a 415 (a backend
        behind the same address that does not) sends it again as JSON, and JSON it stays
        until an answer lists MessagePack again."""
        if self.msgpack:
            outcome = self._post(encode_msgpack(batch), batch, timeout, MSGPACK_TYPE)
            if outcome is not Outcome.UNSUPPORTED:
                return outcome
            self.msgpack = False
            log.info("backend refused MessagePack (415); sending JSON")
        return self._post(encode(batch), batch, timeout)

    def _post(
        self,
        body: bytes,
        batch: Batch | None,
        timeout: float | None = None,
        content_type: str = JSON_TYPE,
    ) -> Outcome:
        """One POST of an encoded batch; `batch` (when known) is only used for counting."""
        t0 = self.clock()
        try:
            kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
            if content_type != JSON_TYPE:
                kwargs["headers"] = {"Content-Type": content_type}
            resp = self.client.post(INGEST_PATH, content=body, **kwargs)
        except httpx.HTTPError as exc:
            return self._transient(
                f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            )
        t1 = self.clock()
        status = resp.status_code
        if 200 <= status < 300:
            self._on_sent(resp, batch, (t0 + t1) / 2)
            return Outcome.SENT
        if status == 415 and content_type != JSON_TYPE:
            return Outcome.UNSUPPORTED
        detail = _server_message(resp)
        if status in (408, 429) or status >= 500:
            return self._transient(f"HTTP {status}: {detail}", _retry_after(resp))
        if status in (401, 403):
            # Not this batch's fault: a wrong token or node binding. Keep the data (bounded
            # by the spool) so it replays once the token is fixed, and say so loudly.
            return self._transient(f"HTTP {status}: {detail} (check the agent token)")
        self._stats.batches_rejected += 1
        self._stats.last_error, self._stats.last_error_at = f"HTTP {status}: {detail}", t1
        log.error("backend refused a batch (HTTP %d: %s); dropped", status, detail)
        return Outcome.REJECTED

    def _on_sent(self, resp: httpx.Response, batch: Batch | None, mid: float) -> None:
        st = self._stats
        if not st.connected and st.last_error:
            log.info("backend reachable again")
        st.connected = True
        st.batches_sent += 1
        st.last_sent_at = self.clock()
        self._attempt, self._retry_at = 0, 0.0
        self._last_batch_mono = self.monotonic()
        self.msgpack = MSGPACK_TYPE in resp.headers.get("accept-post", "")
        if batch is not None:
            st.samples_sent += len(batch.samples)
            st.events_sent += len(batch.events)
            st.steps_sent += len(batch.steps)
        try:
            result = resp.json()
        except ValueError:
            result = None
        received = result.get("received_at") if isinstance(result, dict) else None
        if isinstance(result, dict):
            st.duplicates += bool(result.get("duplicate"))
            pace = result.get("batch_interval_s")
            if isinstance(pace, int | float) and not isinstance(pace, bool):
                self._server_interval = min(max(float(pace), 0.0), MAX_SERVER_INTERVAL_S)
            self.outbox.want_launchers = result.get("launchers") is True
        if isinstance(received, int | float):
            self._clock_offset(float(received) - mid)
        elif "date" in resp.headers:  # 1 s resolution: a hint only
            with contextlib.suppress(TypeError, ValueError):
                self._clock_offset(parsedate_to_datetime(resp.headers["date"]).timestamp() - mid)

    def _clock_offset(self, offset: float) -> None:
        self._stats.clock_offset_s = offset
        if abs(offset) > 5.0 and "offset" not in self._logged:
            self._logged.add("offset")
            log.warning(
                "this node's clock is %.1f s off the backend's; timestamps are taken as they are",
                offset,
            )

    def _transient(self, error: str, retry_after: float = 0.0) -> Outcome:
        st = self._stats
        first = st.connected or error != st.last_error
        st.connected = False
        st.last_error, st.last_error_at = error, self.clock()
        delay = self.rng.uniform(0, min(self.backoff_cap_s, self.backoff_base_s * 2**self._attempt))
        self._attempt = min(self._attempt + 1, 32)
        # Retry-After is the earliest time, the jitter comes on top: every agent an
        # overloaded backend refused in the same second would otherwise come back together.
        self._retry_at = self.monotonic() + retry_after + delay
        if first:
            log.warning("backend unreachable (%s); spooling batches", error)
        return Outcome.TRANSIENT


def _server_message(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    text = str(detail) if detail is not None else resp.text
    return " ".join(text.split())[:300] or resp.reason_phrase


def _retry_after(resp: httpx.Response) -> float:
    try:
        return min(max(float(resp.headers.get("Retry-After", 0)), 0.0), 300.0)
    except ValueError:
        return 0.0  # an HTTP-date: fall back to our own backoff
