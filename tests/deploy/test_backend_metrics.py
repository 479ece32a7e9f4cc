"""The backend's /metrics: incidents by status, restarts by level and cause, engine
leadership, ingest counters; parsed with prometheus-client's own parser, on SQLite and
PostgreSQL."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.support import wait_for
from trainguard.protocol import wire


def scrape(client: Any) -> dict[str, list[Any]]:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out: dict[str, list[Any]] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_incidents_restarts_leader_and_ingest_on_metrics(make_client: Any) -> None:
    client = make_client()
    now = time.time()
    batch = wire.Batch(
        node="n1",
        agent_id="agent000001",
        seq=1,
        sent_at=now,
        ranks=[wire.RankStatus(job="job-1", rank=r, pid=100 + r, world_size=2) for r in (0, 1)],
        steps=[wire.StepReport(job="job-1", rank=0, step=41, start=now - 1, end=now)],
    )
    assert client.post("/api/v1/ingest", content=wire.encode(batch)).status_code == 200
    before = scrape(client)
    assert before["trainguard_open_incidents"][0].value == 0
    assert before["trainguard_database_up"][0].value == 1
    for level in ("in_process", "launcher"):
        r = client.post("/api/v1/jobs/job-1/restarts", json={"level": level, "reason": "test"})
        assert r.status_code == 202, r.text
    client.app.state.metrics_db_cache = None  # the 5 s cache: read again now
    m = scrape(client)
    by_status = {s.labels["status"]: s.value for s in m["trainguard_incidents"]}
    assert by_status["open"] == 2 and by_status["resolved"] == 0
    assert m["trainguard_open_incidents"][0].value == 2
    restarts = {
        (s.labels["level"], s.labels["cause"], s.labels["trigger"]): s.value
        for s in m["trainguard_restarts_total"]
    }
    assert restarts == {
        ("in_process", "operator", "manual"): 1,
        ("launcher", "operator", "manual"): 1,
    }
    # the only replica leads (SQLite: always; PostgreSQL: once it took the lock)
    wait_for(lambda: scrape(client)["trainguard_engine_leader"][0].value == 1)
    assert m["trainguard_ingest_batches_total"][0].value == 1
    assert "trainguard_engine_cycles_total" in m
