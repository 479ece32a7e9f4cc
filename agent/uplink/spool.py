"""A bounded on-disk queue of encoded batches, for while the backend is unreachable.

One file per batch, `<order>-<agent_id>-<seq>.batch` (the uplink may write a larger batch
over the newest under the same name: `replace`), written to a temporary name,
fsync'd and renamed, so a crash leaves whole batches or none. `order` continues across
agent restarts, so batches of an earlier agent process (with their own agent_id and seq)
are replayed first. When the total size would pass `max_bytes` the oldest batches are
dropped; what they held (batches, samples, events, steps, time range) is kept in
`gap.json` until the uplink reports it as a `spool_gap` event.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from dataclasses import asdict, dataclass
from dataclasses import replace as with_fields
from pathlib import Path

import msgspec

from trainguard.protocol.wire import Batch, decode_batch, encode

log = logging.getLogger(__name__)

SUFFIX = ".batch"
GAP_FILE = "gap.json"


class SpoolLocked(RuntimeError):
    """Another agent process holds this spool directory."""


@dataclass
class Gap:
    """What the spool had to drop since the last report."""

    batches: int = 0
    samples: int = 0
    events: int = 0
    steps: int = 0
    start: float | None = None  # earliest timestamp lost
    end: float | None = None  # latest timestamp lost

    def add(self, batch: Batch | None) -> None:
        self.batches += 1
        if batch is None:
            return
        self.samples += len(batch.samples)
        self.events += len(batch.events)
        self.steps += len(batch.steps)
        stamps = [s.ts for s in batch.samples] + [e.ts for e in batch.events]
        stamps += [s.end for s in batch.steps] or [batch.sent_at]
        self.start = min([*stamps, *([self.start] if self.start is not None else [])])
        self.end = max([*stamps, *([self.end] if self.end is not None else [])])

    def event_data(self) -> dict[str, int | float | None]:
        """The `spool_gap` event's data (wire: samples, from, to)."""
        return {
            "samples": self.samples,
            "events": self.events,
            "steps": self.steps,
            "batches": self.batches,
            "from": self.start,
            "to": self.end,
        }


@dataclass(frozen=True)
class SpoolEntry:
    path: Path
    order: int
    agent_id: str
    seq: int
    size: int


def _parse_name(path: Path, size: int) -> SpoolEntry | None:
    parts = path.name[: -len(SUFFIX)].split("-")
    if len(parts) < 3:
        return None
    try:
        return SpoolEntry(path, int(parts[0]), "-".join(parts[1:-1]), int(parts[-1]), size)
    except ValueError:
        return None


class Spool:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lockfile = open(self.dir / ".lock", "a")  # noqa: SIM115 - held until close()
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lockfile.close()
            raise SpoolLocked(f"spool {self.dir} is in use by another agent process") from None
        self._entries: list[SpoolEntry] = []
        for p in self.dir.iterdir():
            if p.name.startswith(".tmp-"):
                p.unlink(missing_ok=True)  # a write cut short by a crash
            elif p.name.endswith(SUFFIX) and (e := _parse_name(p, p.stat().st_size)):
                self._entries.append(e)
        self._entries.sort(key=lambda e: (e.order, e.agent_id, e.seq))
        self._next_order = self._entries[-1].order + 1 if self._entries else 1
        self._bytes = sum(e.size for e in self._entries)
        self._gap = self._load_gap()
        if self._entries:
            log.info(
                "spool %s holds %d batches (%d bytes) to replay",
                self.dir,
                len(self._entries),
                self._bytes,
            )

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def put(self, batch: Batch, body: bytes | None = None) -> SpoolEntry | None:
        """Store one batch at the end of the queue: its entry; None if it was dropped."""
        body = encode(batch) if body is None else body
        with self._lock:
            if len(body) > self.max_bytes:
                self._record_drop(batch)
                return None
            while self._entries and self._bytes + len(body) > self.max_bytes:
                self._drop_oldest()
            name = f"{self._next_order:016d}-{batch.agent_id}-{batch.seq:012d}{SUFFIX}"
            try:
                self._write_atomic(self.dir / name, body)
            except OSError as exc:
                log.warning("spool write failed (%s); batch %d dropped", exc, batch.seq)
                self._record_drop(batch)
                return None
            entry = SpoolEntry(
                self.dir / name, self._next_order, batch.agent_id, batch.seq, len(body)
            )
            self._next_order += 1
            self._entries.append(entry)
            self._bytes += entry.size
            return entry

    def replace(self, entry: SpoolEntry, body: bytes) -> SpoolEntry | None:
        """Write an encoded batch over the newest entry, atomically, under its name (its
        order, agent_id and seq stay): the entry as it now is. None, with the entry as it
        was, when it is no longer the newest, the spool would pass `max_bytes`, or the
        write fails."""
        with self._lock:
            if not self._entries or self._entries[-1] != entry:
                return None
            if self._bytes - entry.size + len(body) > self.max_bytes:
                return None
            try:
                self._write_atomic(entry.path, body)
            except OSError as exc:
                log.warning("spool write failed (%s); batch %d kept as it was", exc, entry.seq)
                return None
            new = with_fields(entry, size=len(body))
            self._entries[-1] = new
            self._bytes += new.size - entry.size
            return new

    def oldest(self) -> SpoolEntry | None:
        with self._lock:
            return self._entries[0] if self._entries else None

    def read(self, entry: SpoolEntry) -> bytes | None:
        """The body of an entry; None (and the entry is dropped) when it is unreadable."""
        try:
            return entry.path.read_bytes()
        except OSError as exc:
            log.warning("spooled batch %s unreadable (%s); dropped", entry.path.name, exc)
            with self._lock:
                self._gap.add(None)
                self._save_gap()
            self.remove(entry)
            return None

    def remove(self, entry: SpoolEntry) -> None:
        with self._lock:
            if entry in self._entries:
                self._entries.remove(entry)
                self._bytes -= entry.size
            entry.path.unlink(missing_ok=True)

    def take_gap(self) -> Gap | None:
        """What was dropped since the last call (None if nothing), and forget it."""
        with self._lock:
            if self._gap.batches == 0:
                return None
            gap, self._gap = self._gap, Gap()
            (self.dir / GAP_FILE).unlink(missing_ok=True)
            return gap

    def close(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._lockfile, fcntl.LOCK_UN)
        self._lockfile.close()

    # --- internals (called with the lock held) ------------------------------------------

    def _drop_oldest(self) -> None:
        entry = self._entries.pop(0)
        self._bytes -= entry.size
        batch: Batch | None
        try:
            batch = decode_batch(entry.path.read_bytes())
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            batch = None
        entry.path.unlink(missing_ok=True)
        self._record_drop(batch)

    def _record_drop(self, batch: Batch | None) -> None:
        self._gap.add(batch)
        self._save_gap()

    def _write_atomic(self, path: Path, data: bytes) -> None:
        tmp = self.dir / f".tmp-{path.name}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _save_gap(self) -> None:
        with contextlib.suppress(OSError):
            self._write_atomic(self.dir / GAP_FILE, json.dumps(asdict(self._gap)).encode())

    def _load_gap(self) -> Gap:
        try:
            return Gap(**json.loads((self.dir / GAP_FILE).read_bytes()))
        except (OSError, ValueError, TypeError):
            return Gap()
