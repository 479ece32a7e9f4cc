"""Building the ingest batches: the outbox's records checked against the wire's own
validation, split to the wire's limits, and an outage's unsent batches merged into one
spool entry (the sender, agent/uplink/sender.py, numbers and sends them)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import msgspec

from trainguard.protocol.wire import (
    MAX_BODY_BYTES,
    MAX_EVENTS,
    MAX_SAMPLES,
    MAX_STEPS,
    Batch,
    Event,
    GpuInfo,
    GpuSample,
    LauncherStatus,
    RankStatus,
    StepReport,
    encode,
)

log = logging.getLogger(__name__)

_DECODERS: dict[type, msgspec.json.Decoder[Any]] = {
    tp: msgspec.json.Decoder(tp) for tp in (GpuSample, Event, StepReport, GpuInfo, RankStatus)
}
BODY_LIMIT = MAX_BODY_BYTES - 4096  # room for the header fields filled in after splitting


def valid_records(records: list[Any], tp: type, errors: list[str]) -> list[Any]:
    """The records that pass the wire's own validation; the first error goes to `errors`."""
    out = []
    for r in records:
        try:
            _DECODERS[tp].decode(encode(r))
        except msgspec.ValidationError as exc:
            errors.append(f"{tp.__name__}: {exc}")  # one entry per invalid record
            continue
        out.append(r)
    return out


@dataclass
class Part:
    samples: list[GpuSample]
    events: list[Event]
    steps: list[StepReport]
    gpus: list[GpuInfo] | None
    ranks: list[RankStatus] | None
    launchers: list[LauncherStatus] | None = None

    def records(self) -> int:
        return len(self.samples) + len(self.events) + len(self.steps)

    def halves(self) -> tuple[Part, Part]:
        hs, he, ht = len(self.samples) // 2, len(self.events) // 2, len(self.steps) // 2
        return (
            Part(
                self.samples[:hs],
                self.events[:he],
                self.steps[:ht],
                self.gpus,
                self.ranks,
                self.launchers,
            ),
            Part(self.samples[hs:], self.events[he:], self.steps[ht:], None, None),
        )

    def batch(self, node: str, agent_id: str, seq: int, sent_at: float, sim: bool) -> Batch:
        return Batch(
            node=node,
            agent_id=agent_id,
            seq=seq,
            sent_at=sent_at,
            simulated=sim,
            gpus=self.gpus,
            samples=self.samples,
            events=self.events,
            steps=self.steps,
            ranks=self.ranks,
            launchers=self.launchers,
        )


def merged(a: Batch, b: Batch, max_bytes: int) -> tuple[Batch, bytes] | None:
    """`b`'s records after `a`'s, under `a`'s key (node, agent_id, seq) with `b`'s time
    and latest state (GPU inventory, rank status, launchers), and its JSON; None when it would pass
    a wire limit or `max_bytes` encoded."""
    if (
        len(a.samples) + len(b.samples) > MAX_SAMPLES
        or len(a.events) + len(b.events) > MAX_EVENTS
        or len(a.steps) + len(b.steps) > MAX_STEPS
    ):
        return None
    merged = msgspec.structs.replace(
        a,
        sent_at=b.sent_at,
        gpus=b.gpus if b.gpus is not None else a.gpus,
        ranks=b.ranks if b.ranks is not None else a.ranks,
        launchers=b.launchers if b.launchers is not None else a.launchers,
        samples=a.samples + b.samples,
        events=a.events + b.events,
        steps=a.steps + b.steps,
    )
    body = encode(merged)
    return (merged, body) if len(body) <= max_bytes else None


def split_to_limits(part: Part) -> list[Part]:
    """Split until every part encodes under the wire's body limit (halving the lists)."""
    probe = part.batch("n", "00000000", 1, 0.0, False)
    if len(encode(probe)) <= BODY_LIMIT:
        return [part]
    if part.records() <= 1:
        log.warning("dropped one record that alone exceeds the %d-byte body limit", MAX_BODY_BYTES)
        return []
    a, b = part.halves()
    return split_to_limits(a) + split_to_limits(b)
