from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.agent.uplink.spool import Spool, SpoolLocked
from trainguard.protocol.wire import Batch, GpuSample, decode_batch, encode


def batch(seq: int, agent_id: str = "agent-aaaaaaaa", samples: int = 4, t0: float = 1000.0):
    return Batch(
        node="n1",
        agent_id=agent_id,
        seq=seq,
        sent_at=t0 + seq,
        samples=[GpuSample(uuid="GPU-x", ts=t0 + seq + i / 10) for i in range(samples)],
    )


def contents(spool: Spool) -> list[tuple[str, int]]:
    """(agent_id, seq) of every spooled batch, oldest first, by consuming the spool."""
    out = []
    while (e := spool.oldest()) is not None:
        b = decode_batch(spool.read(e))
        assert (b.agent_id, b.seq) == (e.agent_id, e.seq)
        out.append((b.agent_id, b.seq))
        spool.remove(e)
    return out


def test_batches_come_back_oldest_first(tmp_path: Path):
    spool = Spool(tmp_path, 1 << 20)
    for seq in (1, 2, 3):
        assert spool.put(batch(seq))
    assert len(spool) == 3 and spool.size_bytes == sum(len(encode(batch(s))) for s in (1, 2, 3))
    assert contents(spool) == [("agent-aaaaaaaa", 1), ("agent-aaaaaaaa", 2), ("agent-aaaaaaaa", 3)]
    assert len(spool) == 0 and spool.size_bytes == 0
    assert not list(tmp_path.glob("*.batch"))


def test_spool_survives_a_restart_and_keeps_the_order(tmp_path: Path):
    first = Spool(tmp_path, 1 << 20)
    for seq in (1, 2):
        first.put(batch(seq, "agent-old00000"))
    first.close()
    (tmp_path / ".tmp-0000000000000009-agent-old00000-000000000009.batch").write_bytes(b"{")
    (tmp_path / "commands-done.log").write_text("cmd-1\n")  # another component's file

    second = Spool(tmp_path, 1 << 20)
    assert len(second) == 2
    second.put(batch(1, "agent-new00000"))  # the new process counts from 1 again
    assert contents(second) == [
        ("agent-old00000", 1),
        ("agent-old00000", 2),
        ("agent-new00000", 1),
    ]
    assert not list(tmp_path.glob(".tmp-*"))  # a write cut short by a crash is cleaned up
    assert (tmp_path / "commands-done.log").exists()


def test_full_spool_drops_the_oldest_and_counts_what_was_lost(tmp_path: Path):
    size = len(encode(batch(1)))
    spool = Spool(tmp_path, size * 3)
    for seq in range(1, 6):
        assert spool.put(batch(seq))
    assert spool.size_bytes <= size * 3
    gap = spool.take_gap()
    assert gap is not None
    assert (gap.batches, gap.samples) == (2, 8)
    assert gap.start == 1001.0 and gap.end == pytest.approx(1002.3)  # batches 1 and 2
    assert gap.event_data()["from"] == 1001.0
    assert spool.take_gap() is None  # reported once
    assert [s for _, s in contents(spool)] == [3, 4, 5]


def test_the_gap_survives_a_restart(tmp_path: Path):
    size = len(encode(batch(1)))
    spool = Spool(tmp_path, size)
    spool.put(batch(1))
    spool.put(batch(2))
    spool.close()
    gap = Spool(tmp_path, size).take_gap()
    assert gap is not None and (gap.batches, gap.samples) == (1, 4)


def test_a_batch_larger_than_the_whole_spool_is_dropped_and_counted(tmp_path: Path):
    spool = Spool(tmp_path, 100)
    assert not spool.put(batch(1, samples=50))
    assert len(spool) == 0
    gap = spool.take_gap()
    assert gap is not None and gap.samples == 50


def test_one_spool_directory_belongs_to_one_agent(tmp_path: Path):
    first = Spool(tmp_path, 1 << 20)
    with pytest.raises(SpoolLocked, match="in use by another agent"):
        Spool(tmp_path, 1 << 20)
    first.close()
    Spool(tmp_path, 1 << 20).close()


def test_an_unreadable_entry_is_dropped_and_counted(tmp_path: Path):
    spool = Spool(tmp_path, 1 << 20)
    spool.put(batch(1))
    entry = spool.oldest()
    assert entry is not None
    entry.path.unlink()
    assert spool.read(entry) is None
    assert len(spool) == 0
    gap = spool.take_gap()
    assert gap is not None and gap.batches == 1
