"""`trainguard bench decode`: what decoding an ingest body costs the backend, in process.

Two bodies, each in JSON and MessagePack: a batch of samples only (the fleet's usual
batch: 8 GPUs x 8 samples) and a batch of 64 events, a few of each kind with the data its
real producer puts in it (rank_exit, xid, checkpoint, ...). Each is decoded by
`wire.decode_batch` (or its MessagePack twin) `loops` times, `repeats` times over; the
report gives the median of the repeats, per batch and per event.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from trainguard.backend.bench.common import busy_sample
from trainguard.protocol import wire

T = 1.8e9


def _samples(gpus: int = 8, per_gpu: int = 8) -> list[wire.GpuSample]:
    return [busy_sample(f"GPU-bench-{i}", T + k) for k in range(per_gpu) for i in range(gpus)]


# What the agent's producers put in each kind's data (agent/ranks, collectors, uplink).
EVENT_DATA: list[tuple[str, dict[str, Any]]] = [
    ("xid", {"source": "kmsg", "action": "RESET_GPU", "pci": "0000:18:00", "pid": 4242}),
    ("gpu_lost", {"source": "nvml", "action": "RESET_GPU", "pci": "0000:18:00"}),
    (
        "rank_start",
        {"pid": 4242, "local_rank": 1, "world_size": 16, "attempt": 0, "iteration": 0},
    ),
    (
        "rank_exit",
        {"pid": 4242, "signal": 9, "clean": False, "last_step": 1200, "launcher_exited": True},
    ),
    ("exception", {"type": "RuntimeError", "step": 1200, "pid": 4242, "uncaught": True}),
    ("hang", {"pid": 4242, "last_step": 1200, "stalled_s": 61.2, "threshold_s": 60.0}),
    ("heartbeat_lost", {"pid": 4242, "age_s": 10.4}),
    ("checkpoint", {"phase": "save_end", "step": 1200, "blocking_s": 2.1, "ok": True}),
    ("restart", {"level": "launcher", "attempt": 1}),
    ("spool_gap", {"samples": 512, "events": 0, "steps": 0, "batches": 8, "from": T, "to": T}),
    ("agent_start", {"version": "0.1", "source": "nvml", "agent_id": "a" * 32, "pid": 7}),
    ("log", {"lr": 0.1, "note": "warmup"}),
]


def _events(n: int = 64) -> list[wire.Event]:
    return [
        wire.Event(kind=kind, ts=T + i, job="bench", rank=i % 8, data=data)  # type: ignore[arg-type]  # the kinds above
        for i, (kind, data) in ((i, EVENT_DATA[i % len(EVENT_DATA)]) for i in range(n))
    ]


def _time(decode: Any, body: bytes, loops: int, repeats: int) -> float:
    """Median seconds per decode over `repeats` runs of `loops` decodes."""
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(loops):
            decode(body)
        runs.append((time.perf_counter() - t0) / loops)
    return statistics.median(runs)


def run(loops: int = 2000, repeats: int = 7) -> dict[str, Any]:
    def make(**records: Any) -> wire.Batch:
        return wire.Batch(node="bench-0", agent_id="bench0000001", seq=1, sent_at=T, **records)

    bodies = {"samples_64": make(samples=_samples()), "events_64": make(events=_events())}
    report: dict[str, Any] = {"loops": loops, "repeats": repeats}
    for name, batch in bodies.items():
        for enc, encode, decode in (
            ("json", wire.encode, wire.decode_batch),
            ("msgpack", wire.encode_msgpack, wire.decode_batch_msgpack),
        ):
            body = encode(batch)
            assert decode(body) == batch
            s = _time(decode, body, loops, repeats)
            report[f"{name} {enc} us/batch"] = round(s * 1e6, 2)
            if batch.events:
                report[f"{name} {enc} us/event"] = round(s * 1e6 / len(batch.events), 3)
    return report
