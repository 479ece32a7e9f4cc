"""Read API: node health from last-seen, downsampled series with gaps, event filters."""

from __future__ import annotations

import time
from typing import Any

from trainguard.protocol import wire


def post(client: Any, node: str, seq: int, samples: list[wire.GpuSample], **kw: Any) -> None:
    """A batch of the node's one GPU, GPU-<node>-0."""
    gpus = [wire.GpuInfo(uuid=f"GPU-{node}-0", index=0, name="sim")]
    post_gpus(client, node, seq, gpus, samples, **kw)


def post_gpus(
    client: Any,
    node: str,
    seq: int,
    gpus: list[wire.GpuInfo],
    samples: list[wire.GpuSample],
    **kw: Any,
) -> None:
    """A batch of several GPUs' samples, their inventory with it."""
    batch = wire.Batch(
        node=node,
        agent_id="agent000001",
        seq=seq,
        sent_at=time.time(),
        simulated=True,
        gpus=gpus,
        samples=samples,
        **kw,
    )
    r = client.post("/api/v1/ingest", content=wire.encode(batch))
    assert r.status_code == 200, r.text


def _health_by_age(age: float, down_after_s: float) -> str:
    return "down" if age > down_after_s else "degraded" if age > down_after_s / 3 else "healthy"


def read_health(client: Any, node: str, down_after_s: float) -> tuple[str, set[str]]:
    """The node's status and the statuses its silence allows: those of its age when the
    read began and when it ended (a slow read may cross a threshold, never skip one)."""
    t0 = time.time()
    n = client.get(f"/api/v1/nodes/{node}").json()
    t1 = time.time()
    return n["status"], {_health_by_age(t - n["last_seen"], down_after_s) for t in (t0, t1)}


def test_node_health_follows_last_seen_and_xids(make_client: Any) -> None:
    # Every read is judged by the node's own last_seen and the read's time: a full run on a
    # busy CI machine took over 4 s between a batch and the read after it, so a fixed
    # "healthy right after the batch" failed there with the status still correct.
    down_after = 12.0
    client = make_client(node_down_after_s=down_after)
    now = time.time()
    post(client, "quiet", 1, [wire.GpuSample(uuid="GPU-quiet-0", ts=now, util=10.0)])
    status, allowed = read_health(client, "quiet", down_after)
    assert status in allowed, (status, allowed)
    post(client, "xid", 1, [], events=[wire.Event(kind="xid", ts=now, xid=79)])
    nodes = {n["name"]: n for n in client.get("/api/v1/nodes").json()}
    assert nodes["quiet"]["simulated"] is True and nodes["quiet"]["gpu_count"] == 1
    # An XID degrades a node however recent its batch, until it is down.
    status, allowed = read_health(client, "xid", down_after)
    assert status == "degraded" and allowed & {"healthy", "degraded"}, (status, allowed)
    # Silence: degraded after a third of the window, down after all of it, each time the
    # node's age says so.
    seen = set()
    deadline = time.time() + 40
    while "down" not in seen and time.time() < deadline:
        status, allowed = read_health(client, "quiet", down_after)
        assert status in allowed, (status, allowed)
        seen.add(status)
        time.sleep(0.25)
    assert {"degraded", "down"} <= seen, seen
    client.post("/api/v1/nodes/quiet/cordon", json={"reason": "bad HBM"})
    assert client.get("/api/v1/nodes/quiet").json()["status"] == "cordoned"
    assert client.get("/api/v1/nodes/nope").status_code == 404


def test_a_gpu_whose_latest_sample_has_no_reading_is_lost_and_degrades_its_node(
    make_client: Any,
) -> None:
    # Silence degrades a node only after 20 s here, so "healthy" below is the lost count's.
    client = make_client(node_down_after_s=60.0)
    now = time.time()
    gpus = [wire.GpuInfo(uuid=f"GPU-bus-{i}", index=i, name="sim") for i in range(2)]

    def send(seq: int, ts: float, lost: bool) -> None:
        # GPU 1 fell off the bus (XID 79): NVML answers nothing, the sample has no reading.
        samples = [
            wire.GpuSample(uuid="GPU-bus-0", ts=ts, util=90.0, temp_c=70.0),
            wire.GpuSample(uuid="GPU-bus-1", ts=ts)
            if lost
            else wire.GpuSample(uuid="GPU-bus-1", ts=ts, util=88.0, temp_c=69.0),
        ]
        post_gpus(client, "bus", seq, gpus, samples)

    send(1, now - 2, lost=False)
    post(client, "fine", 1, [wire.GpuSample(uuid="GPU-fine-0", ts=now, util=10.0)])
    nodes = {n["name"]: n for n in client.get("/api/v1/nodes").json()}
    assert (nodes["bus"]["gpus_lost"], nodes["bus"]["status"]) == (0, "healthy")

    send(2, now - 1, lost=True)
    nodes = {n["name"]: n for n in client.get("/api/v1/nodes").json()}
    # The node's averages still read 90 % (GPU 0 answers): only the count says it.
    assert nodes["bus"]["util_avg"] is not None
    assert (nodes["bus"]["gpus_lost"], nodes["bus"]["status"]) == (1, "degraded")
    assert (nodes["fine"]["gpus_lost"], nodes["fine"]["status"]) == (0, "healthy")
    detail = client.get("/api/v1/nodes/bus").json()
    assert (detail["gpus_lost"], detail["status"]) == (1, "degraded")
    assert [g["lost"] for g in detail["gpus"]] == [False, True]
    assert [g["lost"] for g in client.get("/api/v1/nodes/bus/gpus").json()] == [False, True]

    # After the power cycle it reads again: the latest sample counts, not the history.
    send(3, now, lost=False)
    detail = client.get("/api/v1/nodes/bus").json()
    assert (detail["gpus_lost"], detail["status"]) == (0, "healthy")
    assert [g["lost"] for g in detail["gpus"]] == [False, False]


def test_samples_are_downsampled_and_gaps_are_null(client: Any) -> None:
    t0 = time.time() // 100 * 100 - 3600  # within the ingest window (7 days)
    # 100 s of 1 Hz data, then a 100 s hole, then 100 s more.
    samples = [
        wire.GpuSample(uuid="GPU-n1-0", ts=t0 + i, util=float(i % 100), temp_c=60.0)
        for i in list(range(100)) + list(range(200, 300))
    ]
    post(client, "n1", 1, samples)
    r = client.get(
        "/api/v1/gpus/GPU-n1-0/samples", params={"since": t0, "until": t0 + 300, "points": 30}
    )
    cols = r.json()["columns"]
    assert len(cols["ts"]) <= 31  # 30 buckets + one null row marking the gap
    assert None in cols["util"]
    gap = cols["util"].index(None)
    assert t0 + 100 <= cols["ts"][gap] < t0 + 200
    assert cols["ts"] == sorted(cols["ts"])
    assert all(v == 60.0 for v in cols["temp_c"] if v is not None)
    # Bucket means: the first bucket (10 s wide) averages util 0..9.
    assert abs(cols["util"][0] - 4.5) < 1e-6
    assert client.get("/api/v1/gpus/GPU-nope/samples").status_code == 404
    bad = client.get("/api/v1/gpus/GPU-n1-0/samples", params={"since": 10, "until": 5})
    assert bad.status_code == 400


def test_events_filter_by_node_and_kind(client: Any) -> None:
    now = time.time()
    post(client, "a", 1, [], events=[wire.Event(kind="xid", ts=now, xid=48)])
    post(client, "b", 1, [], events=[wire.Event(kind="rank_exit", ts=now + 1, rank=3)])
    all_events = client.get("/api/v1/events").json()
    assert [e["kind"] for e in all_events] == ["rank_exit", "xid"]  # newest first
    only_a = client.get("/api/v1/events", params={"node": "a"}).json()
    assert [(e["node"], e["xid"]) for e in only_a] == [("a", 48)]
    assert client.get("/api/v1/events", params={"kind": "rank_exit"}).json()[0]["rank"] == 3
    assert client.get("/api/v1/events", params={"kind": "bogus"}).status_code == 422


def test_every_api_route_needs_a_token_but_health_and_ui_do_not(client: Any) -> None:
    anon = {"Authorization": ""}
    for path in (
        "/api/v1/nodes",
        "/api/v1/events",
        "/api/v1/jobs",
        "/api/v1/incidents",
        "/metrics",
    ):
        assert client.get(path, headers=anon).status_code == 401, path
    assert client.get("/healthz", headers=anon).status_code == 200
    assert client.get("/readyz", headers=anon).json() == {"status": "ready"}


def test_a_window_holds_exactly_the_samples_between_its_edges_across_buckets(
    client: Any,
) -> None:
    """Samples are found by their 8 s buckets (migration 0011): a window that starts and
    ends inside a bucket still holds every sample with since <= ts <= until, no more."""
    t0 = time.time() // 8 * 8 - 600 + 3  # 3 s into a bucket
    post(
        client, "edge", 1, [wire.GpuSample(uuid="GPU-edge-0", ts=t0 + i, util=i) for i in range(40)]
    )
    since, until = t0 + 5, t0 + 29  # inside the first bucket and the fourth
    r = client.get(
        "/api/v1/gpus/GPU-edge-0/samples", params={"since": since, "until": until, "points": 24}
    )
    cols = r.json()["columns"]  # a 1 s point a sample
    assert cols["ts"] == [t0 + i for i in range(5, 30)]
    assert cols["util"] == [float(i) for i in range(5, 30)]


def test_a_gpu_silent_for_minutes_still_shows_its_last_sample(client: Any) -> None:
    """The node view looks for each GPU's latest sample around the node's last batch,
    then over every raw sample for a GPU that has been silent since."""
    now = time.time()
    gpus = [wire.GpuInfo(uuid=f"GPU-mute-{i}", index=i, name="sim") for i in range(2)]

    old = now - 900
    mute = [wire.GpuSample(uuid=f"GPU-mute-{i}", ts=old, util=30.0 + i) for i in range(2)]
    post_gpus(client, "mute", 1, gpus, mute)
    post_gpus(client, "mute", 2, gpus, [wire.GpuSample(uuid="GPU-mute-0", ts=now, util=77.0)])
    latest = [g["latest"] for g in client.get("/api/v1/nodes/mute/gpus").json()]
    assert [(s["ts"], s["util"]) for s in latest] == [(now, 77.0), (old, 31.0)]


def test_a_window_read_is_compiled_once_and_each_window_binds_its_own_buckets(
    db_url: str,
) -> None:
    """The buckets are bound parameters (models.cluster._InBuckets): one compiled statement
    serves every window, and a window read through it holds its own samples, not those of
    the window it was compiled for."""
    from sqlalchemy import func, insert, select

    from trainguard.backend import db
    from trainguard.backend.models import Sample, in_sample_window

    engine = db.make_engine(db_url)
    t0 = 1_700_000_000.0  # a bucket's start (t0 / 8 is whole)
    with engine.begin() as conn:
        conn.execute(
            insert(Sample), [{"gpu_id": 7, "ts": t0 + i, "util": float(i)} for i in range(100)]
        )
    cache: dict[Any, Any] = {}
    windows = [(3, 5), (0, 99), (10, 10), (7, 40), (3, 5), (90, 200), (50, 49)]
    with engine.connect().execution_options(compiled_cache=cache) as conn:
        for lo, hi in windows:
            count, total = conn.execute(
                select(func.count(), func.sum(Sample.util)).where(
                    Sample.gpu_id == 7, in_sample_window(t0 + lo, t0 + hi)
                )
            ).one()
            inside = [float(i) for i in range(100) if lo <= i <= hi]
            assert (count, total) == (len(inside), sum(inside) if inside else None), (lo, hi)
    assert len(cache) == 1
    engine.dispose()
