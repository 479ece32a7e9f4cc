"""The agent's in-memory outbox: every producer on the node puts wire records here, the
uplink drains it once per tick (or at once when an urgent event arrives).

Producers: the GPU collectors (samples), the XID watcher (events, urgent), the local SDK
server (steps, rank status, events) and the command executor (events). Thread-safe; bounded
so a stuck uplink cannot grow memory without limit (the oldest records are dropped and
counted, and the count is reported as a `spool_gap` event).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from trainguard.protocol.wire import (
    Event,
    GpuInfo,
    GpuSample,
    LauncherStatus,
    RankStatus,
    StepReport,
)


@dataclass
class Drained:
    samples: list[GpuSample] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    steps: list[StepReport] = field(default_factory=list)
    gpus: list[GpuInfo] | None = None
    ranks: list[RankStatus] | None = None
    launchers: list[LauncherStatus] | None = None
    dropped: int = 0

    def empty(self) -> bool:
        return not (
            self.samples
            or self.events
            or self.steps
            or self.gpus
            or self.ranks
            or self.launchers is not None
        )


class Outbox:
    def __init__(self, max_records: int = 200_000) -> None:
        self._lock = threading.Lock()
        self._samples: deque[GpuSample] = deque()
        self._events: deque[Event] = deque()
        self._steps: deque[StepReport] = deque()
        self._gpus: list[GpuInfo] | None = None
        self._max = max_records
        self._dropped = 0
        self.urgent = threading.Event()
        # Called at drain time for the current rank table (set by the local SDK server).
        self.ranks_provider: Callable[[], list[RankStatus] | None] | None = None
        # Called at drain time for the node's launchers when they are due (the launcher
        # watch's), once the backend said it stores them (`want_launchers`, set by the
        # uplink from its answers: an older backend refuses a batch with them).
        self.launchers_provider: Callable[[bool], list[LauncherStatus] | None] | None = None
        self.want_launchers = False
        # Set by the uplink when it spooled a batch's list (never replayed: it could undo
        # a newer one): the next drain asks for the current list at once.
        self.launchers_unsent = False

    def _trim(self, q: deque) -> None:
        while len(q) > self._max:
            q.popleft()
            self._dropped += 1

    def put_samples(self, samples: list[GpuSample]) -> None:
        with self._lock:
            self._samples.extend(samples)
            self._trim(self._samples)

    def put_event(self, event: Event, urgent: bool = False) -> None:
        with self._lock:
            self._events.append(event)
            self._trim(self._events)
        if urgent:
            self.urgent.set()

    def put_step(self, step: StepReport) -> None:
        with self._lock:
            self._steps.append(step)
            self._trim(self._steps)

    def set_gpus(self, gpus: list[GpuInfo]) -> None:
        """Inventory; sent with the next batch."""
        with self._lock:
            self._gpus = list(gpus)

    def drain(self, max_samples: int, max_events: int, max_steps: int) -> Drained:
        """Take up to the given number of each record kind, oldest first."""
        ranks = self.ranks_provider() if self.ranks_provider else None
        launchers = None
        if self.want_launchers and self.launchers_provider is not None:
            launchers = self.launchers_provider(self.launchers_unsent)
            self.launchers_unsent = False
        with self._lock:
            out = Drained(
                samples=[
                    self._samples.popleft() for _ in range(min(max_samples, len(self._samples)))
                ],
                events=[self._events.popleft() for _ in range(min(max_events, len(self._events)))],
                steps=[self._steps.popleft() for _ in range(min(max_steps, len(self._steps)))],
                gpus=self._gpus,
                ranks=ranks,
                launchers=launchers,
                dropped=self._dropped,
            )
            self._gpus = None
            self._dropped = 0
            self.urgent.clear()
        return out

    def pending(self) -> int:
        with self._lock:
            return len(self._samples) + len(self._events) + len(self._steps)
