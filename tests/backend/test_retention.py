"""Raw samples expire into 60 s and then 900 s rollups; the chart reads span both."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import create_engine, func, select

from trainguard.backend.models import Sample, SampleRollup
from trainguard.backend.retention import Retention, RetentionPolicy
from trainguard.protocol import wire

HOUR = 3600.0


def post(client: Any, seq: int, samples: list[wire.GpuSample]) -> None:
    batch = wire.Batch(
        node="n1",
        agent_id="agent000001",
        seq=seq,
        sent_at=time.time(),
        gpus=[wire.GpuInfo(uuid="GPU-n1-0", index=0)],
        samples=samples,
    )
    assert client.post("/api/v1/ingest", content=wire.encode(batch)).status_code == 200


def counts(url: str) -> tuple[int, dict[int, int]]:
    engine = create_engine(url)
    with engine.connect() as conn:
        raw = conn.execute(select(func.count()).select_from(Sample)).scalar_one()
        roll = dict(
            conn.execute(
                select(SampleRollup.width_s, func.count()).group_by(SampleRollup.width_s)
            ).all()
        )
    engine.dispose()
    return raw, roll


def test_old_samples_fold_into_rollups_and_the_chart_still_shows_them(
    client: Any, db_url: str
) -> None:
    now = time.time() // 900 * 900  # on a 900 s boundary
    old = now - 8 * HOUR  # older than the 6 h raw window
    # Two minutes of 1 Hz data 8 h ago (util 10 then 30), and a minute of fresh data.
    samples = [
        wire.GpuSample(
            uuid="GPU-n1-0",
            ts=old + i,
            util=10.0 if i < 60 else 30.0,
            temp_c=50.0 + (i % 60) / 10,
            pcie_replay=i,
        )
        for i in range(120)
    ]
    samples += [wire.GpuSample(uuid="GPU-n1-0", ts=now - 60 + i, util=90.0) for i in range(60)]
    post(client, 1, samples)
    engine = create_engine(db_url)
    policy = RetentionPolicy(6 * HOUR, 7 * 86400, 90 * 86400)
    report = Retention(engine, policy).run_once(now)
    assert report["raw_folded"] == 120
    raw, roll = counts(db_url)
    assert raw == 60 and roll == {60: 2}
    # The chart over the last 9 hours shows the old minutes (from rollups) and the fresh one.
    cols = client.get(
        "/api/v1/gpus/GPU-n1-0/samples",
        params={"since": now - 9 * HOUR, "until": now, "points": 9 * 60},
    ).json()["columns"]
    values = [u for u in cols["util"] if u is not None]
    assert values[:2] == [10.0, 30.0] and values[-1] == 90.0
    assert max(v for v in cols["pcie_replay"] if v is not None) == 119
    # A late sample for an already folded minute is merged by weighted mean.
    post(client, 2, [wire.GpuSample(uuid="GPU-n1-0", ts=old + 1.5, util=70.0)])
    Retention(engine, policy).run_once(now)
    with engine.connect() as conn:
        first = conn.execute(
            select(SampleRollup.n, SampleRollup.util).order_by(SampleRollup.bucket).limit(1)
        ).one()
    assert first.n == 61 and abs(first.util - (10.0 * 60 + 70.0) / 61) < 1e-3
    # A week later the minutes fold into 15-minute rollups (the old pair into one, the
    # fresh minute, raw until then, into another); after 90 days they are gone.
    Retention(engine, policy).run_once(now + 8 * 86400)
    assert counts(db_url) == (0, {900: 2})
    with engine.connect() as conn:
        ns = conn.execute(select(SampleRollup.n).order_by(SampleRollup.bucket)).scalars().all()
    assert ns == [121, 60]
    Retention(engine, policy).run_once(now + 91 * 86400)
    assert counts(db_url) == (0, {})
    engine.dispose()


def test_batch_keys_are_kept_as_long_as_the_raw_samples(client: Any, db_url: str) -> None:
    """A batch's key dedups its replay while its samples are raw, and is dropped with
    them: before, nothing deleted ingest_batches (2,048 rows a second at 16,384 nodes)."""
    from trainguard.backend.models import IngestBatch

    t = time.time()
    post(client, 1, [wire.GpuSample(uuid="GPU-n1-0", ts=t, util=1.0)])
    post(client, 2, [wire.GpuSample(uuid="GPU-n1-0", ts=t + 1, util=2.0)])
    engine = create_engine(db_url)
    retention = Retention(engine, RetentionPolicy(6 * HOUR, 7 * 86400, 90 * 86400))
    try:
        assert retention.run_once(t + HOUR)["batch_keys_dropped"] == 0
        replay = wire.Batch(
            node="n1", agent_id="agent000001", seq=1, sent_at=time.time(), samples=[]
        )
        r = client.post("/api/v1/ingest", content=wire.encode(replay))
        assert r.status_code == 200 and r.json()["duplicate"] is True
        report = retention.run_once(t + 7 * HOUR)
        with engine.connect() as conn:
            keys = conn.execute(select(func.count()).select_from(IngestBatch)).scalar_one()
    finally:
        engine.dispose()
    assert (report["batch_keys_dropped"], report["raw_folded"], keys) == (2, 2, 0)


def test_a_run_with_nothing_past_the_cutoff_reads_neither_table(client: Any, db_url: str) -> None:
    """The first raw_retention_s of a deployment have nothing to fold: a run asks each
    table for its oldest entry (one descent of an index) and runs nothing else on them.
    Before, every run folded and deleted `bucket <= cutoff`, which PostgreSQL without
    statistics planned as a scan of every raw sample, once a minute."""
    from sqlalchemy import event

    t = time.time()
    post(client, 1, [wire.GpuSample(uuid="GPU-n1-0", ts=t - 60 + i, util=1.0) for i in range(60)])
    engine = create_engine(db_url)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    try:
        report = Retention(engine, RetentionPolicy(6 * HOUR, 7 * 86400, 90 * 86400)).run_once(t)
    finally:
        engine.dispose()
    assert (report["raw_folded"], report["batch_keys_dropped"]) == (0, 0)
    on_samples = [s for s in statements if "samples " in s or s.endswith("samples")]
    on_keys = [s for s in statements if "ingest_batches" in s]
    assert on_samples == ["SELECT min(bucket) FROM samples"]
    assert on_keys == ["SELECT min(received_at) FROM ingest_batches"]
    assert counts(db_url)[0] == 60
