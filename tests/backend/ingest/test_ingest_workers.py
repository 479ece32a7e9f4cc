"""`trainguard server --workers 2`: two real server processes on one port and one
PostgreSQL database (a database of this module's own). A batch replayed over many
connections, which the kernel spreads over both workers, is stored once; the decision
engine runs on one worker only; SQLite refuses several workers."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from sqlalchemy import create_engine, func, select, text

from tests.conftest import cli_upgrade, scratch_pg_database
from tests.support import AUTH, TOKEN, free_port, stop_session, wait_for
from trainguard.backend.engine.leader import ENGINE_LOCK_KEY
from trainguard.backend.models import IngestBatch, Sample
from trainguard.backend.workers import listen_backlog
from trainguard.protocol import wire

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[3]
WORKERS = 2


@pytest.fixture(scope="module")
def workers_db() -> Iterator[str]:
    with scratch_pg_database("tg_workers", "the workers test", cli_upgrade) as url:
        yield url


class Served(NamedTuple):
    base: str
    pid: int  # the supervisor's


@pytest.fixture(scope="module")
def server(workers_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("workers")
    port = free_port()
    log = tmp / "server.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainguard.agent.cli", "server", "--port", str(port)],
        cwd=ROOT,
        env={
            **os.environ,
            "TRAINGUARD_ADMIN_TOKEN": TOKEN,
            "TRAINGUARD_DATABASE_URL": workers_db,
            "TRAINGUARD_DATA_DIR": str(tmp),
            "TRAINGUARD_SERVER_WORKERS": str(WORKERS),
        },
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    seen: set[str] = set()

    def every_worker_ready() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            r = httpx.get(f"{base}/readyz", timeout=2)  # a new connection each time
        except httpx.TransportError:
            return False
        if r.status_code == 200:
            seen.add(r.headers["x-trainguard-worker"])
        return len(seen) == WORKERS

    try:
        assert wait_for(every_worker_ready, timeout=90), log.read_text()[-3000:]
        yield Served(base, proc.pid)
    finally:
        stop_session(proc)
    assert proc.returncode == 0, log.read_text()[-3000:]


def _count(url: str, model: Any) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(model)).scalar_one())
    finally:
        engine.dispose()


def _batch(node: str, seq: int) -> wire.Batch:
    now = time.time()
    return wire.Batch(
        node=node,
        agent_id="agent-replayed",
        seq=seq,
        sent_at=now,
        gpus=[wire.GpuInfo(uuid=f"GPU-{node}-{i}", index=i) for i in range(4)],
        samples=[wire.GpuSample(uuid=f"GPU-{node}-{i}", ts=now, util=50.0) for i in range(4)],
    )


def test_a_batch_replayed_over_both_workers_is_stored_once(server: Served, workers_db: str) -> None:
    body = wire.encode(_batch("replayed-node", 7))
    answers: list[tuple[int, str, Any]] = []
    start = threading.Barrier(16)

    def send() -> None:
        # A fresh connection each: the kernel spreads them over the workers' sockets.
        with httpx.Client(base_url=server.base, headers=AUTH, timeout=30) as http:
            start.wait()
            r = http.post("/api/v1/ingest", content=body)
            answers.append((r.status_code, r.headers.get("x-trainguard-worker", ""), r.json()))

    threads = [threading.Thread(target=send) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [a[0] for a in answers] == [200] * 16, answers
    assert {a[1] for a in answers} == {str(i) for i in range(WORKERS)}  # both took some
    assert sorted(a[2]["duplicate"] for a in answers) == [False] + [True] * 15
    assert _count(workers_db, IngestBatch) == 1
    assert _count(workers_db, Sample) == 4


def test_the_engine_runs_on_one_worker_only(server: Served, workers_db: str) -> None:
    def leaders() -> dict[str, bool]:
        states: dict[str, bool] = {}
        for _ in range(40):  # new connections until every worker has answered
            r = httpx.get(f"{server.base}/api/v1/engine", headers=AUTH, timeout=5)
            states[r.headers["x-trainguard-worker"]] = r.json()["leader"]
            if len(states) == WORKERS:
                break
        return states

    states = wait_for(lambda: (s := leaders()) and any(s.values()) and s, timeout=30)
    assert len(states) == WORKERS
    assert sorted(states.values()) == [False] * (WORKERS - 1) + [True]
    engine = create_engine(workers_db)
    try:
        with engine.connect() as conn:
            holders = conn.execute(
                text(
                    "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                    "WHERE l.locktype = 'advisory' AND l.granted "
                    "AND d.datname = current_database() "
                    "AND ((l.classid::bigint << 32) | l.objid::bigint) = :k"
                ),
                {"k": ENGINE_LOCK_KEY},
            ).scalar_one()
    finally:
        engine.dispose()
    assert holders == 1


def test_every_worker_listens_with_the_backlog_the_kernel_allows(server: Served) -> None:
    """uvicorn listens again on the socket it is given, with its own backlog (2,048 unless
    told): each worker's socket must keep the supervisor's, the kernel's cap, or a
    cluster's reconnect burst overflows it (docs/benchmarks.md)."""
    if shutil.which("ss") is None:
        pytest.skip("needs ss (iproute2) to read a listening socket's backlog")
    port = server.base.rsplit(":", 1)[1]
    out = subprocess.run(
        ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    backlogs = [int(line.split()[2]) for line in out.splitlines()]  # Send-Q: the backlog
    assert backlogs == [listen_backlog()] * WORKERS, out
    assert listen_backlog() >= 2048


def _worker_pids(supervisor: int) -> list[int]:
    with open(f"/proc/{supervisor}/task/{supervisor}/children") as f:
        children = [int(c) for c in f.read().split()]
    pids = []
    for pid in children:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"resource_tracker" not in f.read():
                pids.append(pid)
    return pids


def test_a_worker_that_dies_is_started_again(server: Served) -> None:
    before = _worker_pids(server.pid)
    assert len(before) == WORKERS
    os.kill(before[0], signal.SIGKILL)

    def replaced() -> bool:
        pids = _worker_pids(server.pid)
        return len(pids) == WORKERS and before[0] not in pids

    assert wait_for(replaced, timeout=30)
    seen: set[str] = set()

    def both_answer() -> bool:
        try:
            r = httpx.post(
                f"{server.base}/api/v1/ingest",
                content=wire.encode(_batch("after-restart", len(seen) + 100)),
                headers=AUTH,
                timeout=5,
            )
        except httpx.TransportError:
            return False
        if r.status_code == 200:
            seen.add(r.headers["x-trainguard-worker"])
        return len(seen) == WORKERS

    assert wait_for(both_answer, timeout=60)


def test_several_workers_on_sqlite_are_refused_in_one_line(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "trainguard.agent.cli", "server", "--workers", "2"],
        cwd=ROOT,
        env={
            **os.environ,
            "TRAINGUARD_ADMIN_TOKEN": TOKEN,
            "TRAINGUARD_DATABASE_URL": f"sqlite:///{tmp_path / 'one.db'}",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "trainguard: --workers above 1 needs PostgreSQL (SQLite is the one-process path)"
    ]
