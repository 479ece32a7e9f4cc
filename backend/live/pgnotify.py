"""Live updates across replicas: the live bus, fanned out with PostgreSQL LISTEN/NOTIFY.

With several backend replicas behind one address, a browser's SSE stream is held by one
replica while the batch, the event or the incident it wants to see is produced on another
(the agent posted there; the engine leads there). `PgNotifyBus` is a `LiveBus` that also
sends what it publishes to the other replicas and publishes what they send:

- every replica LISTENs on one channel (`trainguard_live`) on a dedicated connection and
  publishes each message from another replica on its own bus (its own are skipped);
- a message goes out only when some other replica has a subscriber for its topic: each
  replica announces its subscribed topics every `interest_every_s` (and at once when a
  stream asks for a topic it had no subscriber for), and an announcement expires after
  three periods. So a node's samples cross the database only while somebody watches
  that node, and `wants()` answers for the whole cluster;
- `nodes` stays local: each replica's own ticker reads the snapshot from the database;
- publishing never blocks: messages go through a bounded queue to a sender thread with
  its own connection, which sends what is waiting in one transaction. A message that
  cannot be sent (database down, queue full) is dropped and counted, like a slow SSE
  client's; browsers reload from the REST API;
- NOTIFY payloads are limited to 8000 bytes: a larger message is compressed, and split
  into numbered chunks that the receiver reassembles (incomplete ones expire).

Each notification is `<kind>|<replica>|<seq>|<body>` with kind `m` (message), `c` (chunk)
or `i` (interest); the sequence number keeps PostgreSQL from folding two identical
payloads of one transaction into one.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import queue
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

import msgspec
from sqlalchemy.engine import make_url

from trainguard.backend.live.bus import LiveBus, Subscription

log = logging.getLogger(__name__)

CHANNEL = "trainguard_live"
PAYLOAD_LIMIT = 7900  # PostgreSQL refuses payloads of 8000 bytes and more
LOCAL_TOPICS = frozenset({"nodes"})
CHUNK_TTL_S = 10.0

_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()


def conninfo(url: str) -> str:
    """A libpq URI for psycopg from the SQLAlchemy URL (postgresql+psycopg://...)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@dataclass
class FanoutStats:
    sent: int = 0  # notifications sent (a chunked message counts each chunk)
    received: int = 0  # messages from other replicas published here
    dropped: int = 0  # messages not sent (queue full, database errors)
    errors: int = 0
    reconnects: int = 0
    remote_topics: int = 0
    last_error: str = ""
    chunks_expired: int = field(default=0)


def encode_notifications(replica: str, seq: int, topic: str, name: str, data: Any) -> list[str]:
    """The notifications that carry one message (one, or several chunks)."""
    body = _json.encode({"t": topic, "n": name, "d": data}).decode()
    header = f"m|{replica}|{seq}|"
    if len(header) + len(body.encode()) <= PAYLOAD_LIMIT:
        return [header + body]
    packed = base64.b64encode(zlib.compress(body.encode(), 6)).decode("ascii")
    room = PAYLOAD_LIMIT - 64
    pieces = [packed[i : i + room] for i in range(0, len(packed), room)]
    return [f"c|{replica}|{seq}|{i}|{len(pieces)}|{p}" for i, p in enumerate(pieces)]


class PgNotifyBus(LiveBus):
    def __init__(
        self,
        url: str,
        channel: str = CHANNEL,
        interest_every_s: float = 2.0,
        queue_max: int = 10_000,
        retry_s: float = 1.0,
    ) -> None:
        super().__init__()
        self.conninfo = conninfo(url)
        self.channel = channel
        self.replica = uuid.uuid4().hex[:12]
        self.interest_every_s = interest_every_s
        self.retry_s = retry_s
        self.stats = FanoutStats()
        self._out: queue.Queue[str] = queue.Queue(queue_max)
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._remote: dict[str, tuple[frozenset[str], float]] = {}  # replica -> topics, until
        self._remote_lock = threading.Lock()
        self._chunks: dict[tuple[str, str], tuple[dict[int, str], int, float]] = {}
        self._announced: frozenset[str] = frozenset()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listen_conn: Any = None
        self.listening = threading.Event()  # set while LISTEN is in place

    # --- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start the sender and the listener (they connect, and reconnect, on their own:
        a database that is down at start does not stop the replica)."""
        self._stop.clear()
        for target, name in ((self._send_loop, "tg-notify-out"), (self._listen_loop, "tg-listen")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with contextlib.suppress(queue.Full):
            self._out.put_nowait("")  # wake the sender
        for t in self._threads:
            t.join(timeout)
        self._threads.clear()

    # --- the LiveBus interface ---------------------------------------------------------

    def subscribe(self, topics: frozenset[str]) -> Subscription:
        sub = super().subscribe(topics)
        if not topics - LOCAL_TOPICS <= self._announced:
            self._announce()  # a topic nobody here watched: tell the others now
        return sub

    def wants(self, topic: str) -> bool:
        return super().wants(topic) or (topic not in LOCAL_TOPICS and self._remote_wants(topic))

    def publish(self, topic: str, name: str, data: Any) -> None:
        super().publish(topic, name, data)
        if topic in LOCAL_TOPICS or not self._remote_wants(topic):
            return
        try:
            notes = encode_notifications(self.replica, self._next_seq(), topic, name, data)
        except (TypeError, msgspec.EncodeError) as exc:
            log.warning("live fan-out: cannot encode a %s message: %s", name, exc)
            self.stats.dropped += 1
            return
        for n in notes:
            try:
                self._out.put_nowait(n)
            except queue.Full:
                self.stats.dropped += 1
                return

    # --- interest ---------------------------------------------------------------------

    def local_topics(self) -> frozenset[str]:
        with self._lock:
            return frozenset().union(*(s.topics for s in self._subs)) - LOCAL_TOPICS

    def _remote_wants(self, topic: str) -> bool:
        now = time.monotonic()
        with self._remote_lock:
            return any(topic in t and until > now for t, until in self._remote.values())

    def _announce(self) -> None:
        topics = self.local_topics()
        self._announced = topics
        body = _json.encode({"topics": sorted(topics), "ttl": 3 * self.interest_every_s})
        with contextlib.suppress(queue.Full):
            self._out.put_nowait(f"i|{self.replica}|{self._next_seq()}|{body.decode()}")

    def _next_seq(self) -> int:
        with self._seq_lock:
            self._seq += 1
            return self._seq

    # --- sending ----------------------------------------------------------------------

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5)

    def _send_loop(self) -> None:
        conn: Any = None
        next_announce = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_announce:
                self._announce()
                next_announce = now + self.interest_every_s
            try:
                first = self._out.get(timeout=max(0.01, next_announce - now))
            except queue.Empty:
                continue
            batch = [first] if first else []
            while len(batch) < 500:
                try:
                    n = self._out.get_nowait()
                except queue.Empty:
                    break
                if n:
                    batch.append(n)
            if not batch:
                continue
            try:
                if conn is None or conn.closed:
                    conn = self._connect()
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany("SELECT pg_notify(%s, %s)", [(self.channel, n) for n in batch])
                self.stats.sent += len(batch)
            except Exception as exc:
                self._failed("send", exc)
                self.stats.dropped += sum(1 for n in batch if not n.startswith("i|"))
                with contextlib.suppress(Exception):
                    conn.close()
                conn = None
                self._stop.wait(self.retry_s)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _failed(self, what: str, exc: BaseException) -> None:
        self.stats.errors += 1
        self.stats.last_error = f"{what}: {str(exc).strip()[:200]}"
        if self.stats.errors in (1, 10, 100) or self.stats.errors % 1000 == 0:
            log.warning("live fan-out %s failed (%d so far): %s", what, self.stats.errors, exc)

    # --- receiving --------------------------------------------------------------------

    def _listen_loop(self) -> None:
        first = True
        while not self._stop.is_set():
            try:
                conn = self._connect()
            except Exception as exc:
                self._failed("connect", exc)
                self._stop.wait(self.retry_s)
                continue
            if not first:
                self.stats.reconnects += 1
            first = False
            try:
                with conn:
                    conn.execute(f'LISTEN "{self.channel}"')
                    self.listening.set()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.25):
                            self.handle(note.payload)
            except Exception as exc:
                self._failed("listen", exc)
                self._stop.wait(self.retry_s)
            finally:
                self.listening.clear()

    def handle(self, payload: str) -> None:
        """One notification from the channel (public for tests of the format)."""
        try:
            kind, replica, _seq, rest = payload.split("|", 3)
        except ValueError:
            return
        if replica == self.replica:
            return
        try:
            if kind == "m":
                self._deliver(_decode.decode(rest))
            elif kind == "c":
                self._chunk(replica, _seq, rest)
            elif kind == "i":
                msg = _decode.decode(rest)
                ttl = min(float(msg.get("ttl", 6.0)), 60.0)
                now = time.monotonic()
                with self._remote_lock:
                    self._remote[replica] = (frozenset(msg["topics"]), now + ttl)
                    self._remote = {r: v for r, v in self._remote.items() if v[1] > now}
                    live = [t for t, _ in self._remote.values()]
                self.stats.remote_topics = len(frozenset().union(*live))
        except Exception as exc:  # a malformed notification must not stop the listener
            self._failed("decode", exc)

    def _chunk(self, replica: str, seq: str, rest: str) -> None:
        i_s, n_s, piece = rest.split("|", 2)
        key = (replica, seq)
        now = time.monotonic()
        parts, n, _ = self._chunks.get(key, ({}, int(n_s), now))
        parts[int(i_s)] = piece
        if len(parts) < n:
            self._chunks[key] = (parts, n, now)
            expired = [k for k, (_, _, t) in self._chunks.items() if now - t > CHUNK_TTL_S]
            for k in expired:
                del self._chunks[k]
            self.stats.chunks_expired += len(expired)
            return
        self._chunks.pop(key, None)
        packed = "".join(parts[i] for i in range(n))
        self._deliver(_decode.decode(zlib.decompress(base64.b64decode(packed))))

    def _deliver(self, msg: dict[str, Any]) -> None:
        self.stats.received += 1
        LiveBus.publish(self, msg["t"], msg["n"], msg["d"])


def bus_for(url: str) -> LiveBus:
    """The live bus of a replica: fanned out over PostgreSQL, in-process on SQLite."""
    return PgNotifyBus(url) if url.startswith("postgresql") else LiveBus()
