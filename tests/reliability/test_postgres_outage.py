"""PostgreSQL stopped during ingest (a private cluster of the test's own, never the shared
server): the backend answers 503 with Retry-After, never 500, while it is down; the agents
spool; after PostgreSQL is back everything they sampled is stored exactly once.

The outage lasts TRAINGUARD_TEST_PG_OUTAGE_S seconds (default 5, for CI; the issue's
30 s: `TRAINGUARD_TEST_PG_OUTAGE_S=30 pytest tests/reliability/test_postgres_outage.py`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.reliability.harness import (
    ADMIN,
    Agent,
    Backend,
    Ledger,
    PrivatePostgres,
    Procs,
    agent_tokens,
    batches_stored,
)
from tests.security.conftest import batch
from tests.support import free_port, wait_for
from trainguard.backend import db

pytestmark = pytest.mark.slow

OUTAGE_S = float(os.environ.get("TRAINGUARD_TEST_PG_OUTAGE_S", "5"))
NODES = ["pgout-a", "pgout-b"]


@pytest.fixture
def postgres() -> Iterator[PrivatePostgres]:
    pg = PrivatePostgres()
    try:
        pg.start()
        yield pg
    finally:
        pg.close()


def test_postgres_down_means_503_and_spooling_then_nothing_lost(
    procs: Procs, postgres: PrivatePostgres, tmp_path: Path
) -> None:
    url = postgres.url
    db.upgrade(url)  # PostgreSQL is migrated explicitly, as in production
    tokens = agent_tokens(url, NODES)
    port = free_port()
    backend = Backend(
        procs, port, {"TRAINGUARD_DATABASE_URL": url, "TRAINGUARD_DATA_DIR": str(tmp_path)}
    ).start()
    agents = [Agent(procs, n, tokens[n], port, gpus=2, interval=0.1).start() for n in NODES]
    wait_for(lambda: all(batches_stored(url).get(n, 0) >= 10 for n in NODES), 60)

    postgres.stop("fast")
    down_at = time.monotonic()
    seen: dict[str, set[int]] = {"ingest": set(), "nodes": set(), "readyz": set()}
    api = httpx.Client(base_url=backend.url, headers=ADMIN, timeout=10)

    def outage_observed() -> bool:
        """Probe every kind of request while the database is away (each poll of the wait)."""
        r = api.post("/api/v1/ingest", content=batch("probe", seq=int(time.time() * 1e3)))
        seen["ingest"].add(r.status_code)
        if r.status_code == 503:
            assert r.headers["retry-after"] and "retry" in r.json()["detail"]
        seen["nodes"].add(api.get("/api/v1/nodes").status_code)
        seen["readyz"].add(api.get("/readyz").status_code)
        return time.monotonic() - down_at >= OUTAGE_S and all(
            a.spooled_ticks() >= 5 for a in agents
        )

    wait_for(outage_observed, OUTAGE_S + 60, 0.25)
    postgres.start()
    back_at = time.time()

    # The agents replay their spools; ingest goes on.
    before = batches_stored(url)
    wait_for(
        lambda: (
            all(a.spooled() == 0 for a in agents)
            and all(batches_stored(url).get(n, 0) > before.get(n, 0) + 10 for n in NODES)
        ),
        120,
    )
    assert api.get("/readyz").status_code == 200
    for a in agents:
        assert a.stop() == 0, procs.log(a.log_name)[-3000:]
        assert a.spooled() == 0

    assert seen == {"ingest": {503}, "nodes": {503}, "readyz": {503}}, seen
    ledger = Ledger.read(url)
    ledger.assert_exactly_once(agents, max_tick_gap_s=2.0)
    assert ledger.gaps == []
    nodes = {n["name"]: n for n in api.get("/api/v1/nodes").json()}
    assert all(nodes[n]["last_seen"] >= back_at for n in NODES)
    statuses = backend.statuses()
    assert statuses.get(503, 0) >= 3 and 500 not in statuses, statuses
    assert backend.proc is not None and backend.proc.poll() is None
