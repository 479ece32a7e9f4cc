"""Refusals that change nothing: a malformed policy file, a bad token, a replayed command
ack or batch, a command for an unknown job. Each gets its own clear error; the database
is the same, row for row, before and after."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select, text

from tests.reliability.harness import Agent, Backend, Procs, agent_tokens
from tests.security.conftest import batch, bearer
from tests.support import TOKEN, free_port, wait_for
from trainguard.backend import db
from trainguard.backend.models import Base


def snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, in a stable order."""
    engine = create_engine(url)
    out = {}
    with engine.connect() as conn:
        for table in Base.metadata.sorted_tables:
            rows = conn.execute(select(table)).all()
            out[table.name] = sorted((tuple(r) for r in rows), key=repr)
    engine.dispose()
    return out


def test_refused_and_replayed_requests_change_nothing(make_client: Any, db_url: str) -> None:
    # Nothing in the background writes: what changes, a request changed.
    client = make_client(engine_enabled=False, analytics_interval_s=0)
    ranks = [{"job": "job-1", "rank": 0, "pid": 4242}]
    first = batch("n1", ranks=ranks)
    assert client.post("/api/v1/ingest", content=first).status_code == 200
    r = client.post("/api/v1/jobs/job-1/restarts", json={"level": "launcher", "reason": "x"})
    assert r.status_code == 202
    incident = r.json()
    [cmd] = client.get("/api/v1/agents/n1/commands", params={"wait": 0}).json()
    ack = {"phase": "delivered", "ts": time.time(), "node": "n1"}
    url = f"/api/v1/commands/{cmd['id']}/acks"
    assert client.post(url, json=ack).json() == {"ok": True, "duplicate": False}
    before = snapshot(db_url)
    timeline = client.get(f"/api/v1/incidents/{incident['id']}").json()["timeline"]

    wrong = bearer("tg_" + "0" * 43)
    refusals: list[tuple[str, str, dict[str, Any], int, str]] = [
        # a bad token, on each kind of route
        (
            "POST",
            "/api/v1/ingest",
            {"content": batch("n1", seq=2), "headers": wrong},
            401,
            "invalid or revoked token",
        ),
        (
            "POST",
            "/api/v1/nodes/n1/cordon",
            {"json": {"reason": "x"}, "headers": wrong},
            401,
            "invalid or revoked token",
        ),
        (
            "POST",
            "/api/v1/jobs/job-1/restarts",
            {"json": {"level": "launcher", "reason": "x"}, "headers": {"Authorization": "Bearer"}},
            401,
            "missing bearer token",
        ),
        # replays: answered, not applied twice
        ("POST", url, {"json": ack}, 200, ""),
        ("POST", url, {"json": {**ack, "ts": time.time() + 5}}, 200, ""),
        ("POST", "/api/v1/ingest", {"content": first}, 200, ""),
        # unknown or wrong targets
        ("POST", "/api/v1/commands/nope/acks", {"json": ack}, 404, "no command 'nope'"),
        ("POST", url, {"json": {**ack, "node": "n2"}}, 409, "not addressed to node 'n2'"),
        (
            "POST",
            "/api/v1/jobs/nope/restarts",
            {"json": {"level": "launcher", "reason": "x"}},
            404,
            "nope",
        ),
        ("POST", "/api/v1/nodes/nope/cordon", {"json": {"reason": "x"}}, 404, "nope"),
        ("POST", "/api/v1/incidents/999/approve", {"json": {"reason": "x"}}, 404, "999"),
        (
            "POST",
            f"/api/v1/incidents/{incident['id']}/approve",
            {"json": {"reason": "x"}},
            409,
            "not awaiting approval",
        ),
        (
            "POST",
            f"/api/v1/incidents/{incident['id']}/reject",
            {"json": {"reason": "x"}},
            409,
            "not awaiting approval",
        ),
    ]
    for method, path, kw, status, words in refusals:
        r = client.request(method, path, **kw)
        assert r.status_code == status, (path, r.text)
        if status >= 400:
            assert words in r.json()["detail"], (path, r.json())
        elif path == "/api/v1/ingest":
            assert r.json()["duplicate"] is True
        else:
            assert r.json() == {"ok": True, "duplicate": True}

    assert snapshot(db_url) == before
    assert client.get(f"/api/v1/incidents/{incident['id']}").json()["timeline"] == timeline


# --- process level ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("policy", "words"),
    [
        ("[causes\nexception = 1", "not valid TOML: Expected ']'"),
        ('[causes]\nexception = "restart"\n', "causes.exception (line 2): 'restart' is not"),
        ("[limits]\nbudget = -1\n", "limits.budget (line 2): unknown key"),
    ],
    ids=["not TOML", "unknown action", "unknown key"],
)
def test_a_malformed_policy_file_stops_the_server_with_one_line(
    tmp_path: Path, policy: str, words: str
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    url = f"sqlite:///{data / 'trainguard.db'}"
    db.upgrade(url)
    digest = hashlib.sha256((data / "trainguard.db").read_bytes()).hexdigest()
    bad = tmp_path / "policy.toml"
    bad.write_text(policy)
    proc = subprocess.run(
        [sys.executable, "-m", "trainguard.agent.cli", "server", "--port", str(free_port())],
        env={
            "PATH": "/usr/bin:/bin",
            "TRAINGUARD_ADMIN_TOKEN": TOKEN,
            "TRAINGUARD_DATA_DIR": str(data),
            "TRAINGUARD_POLICY_FILE": str(bad),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2, out
    assert len(out.splitlines()) == 1 and "Traceback" not in out, out
    assert out.startswith("trainguard: bad setting policy_file: ") and words in out, out
    assert str(bad) in out
    assert hashlib.sha256((data / "trainguard.db").read_bytes()).hexdigest() == digest


@pytest.mark.slow
def test_an_agent_with_a_bad_token_stores_nothing_and_keeps_its_data_until_fixed(
    procs: Procs, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    url = f"sqlite:///{data / 'trainguard.db'}"
    db.upgrade(url)
    tokens = agent_tokens(url, ["good-node", "other-node"])
    port = free_port()
    backend = Backend(procs, port, {"TRAINGUARD_DATA_DIR": str(data)}).start()
    api = backend.api()
    # A made-up token, then a real one bound to another node.
    agent = Agent(procs, "good-node", "tg_" + "z" * 43, port, interval=0.1)
    agent.start()
    wait_for(lambda: agent.spooled_ticks() >= 5, 30)

    def log() -> str:
        return procs.log(agent.log_name)

    wait_for(lambda: "HTTP 401: invalid or revoked token (check the agent token)" in log(), 30)
    assert agent.stop() == 0
    agent.token = tokens["other-node"]
    agent.start()
    wait_for(lambda: "HTTP 403: this token is bound to node 'other-node'" in log(), 30)
    assert agent.stop() == 0
    assert api.get("/nodes").json() == []  # nothing stored, no node made up
    with create_engine(url).connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM ingest_batches")).scalar_one() == 0
    spooled, fixed_at = agent.spooled_ticks(), time.time()
    assert spooled >= 5

    agent.token = tokens["good-node"]
    agent.start()
    wait_for(lambda: agent.spooled() == 0, 60)
    uuid = api.get("/nodes/good-node/gpus").json()[0]["uuid"]
    early = api.get(f"/gpus/{uuid}/samples", params={"until": fixed_at, "points": 5000})
    assert [t for t in early.json()["columns"]["ts"] if t is not None]  # kept, then delivered
    assert agent.stop() == 0
    assert len(api.get("/events", params={"kind": "agent_start"}).json()) == 3
    assert 500 not in backend.statuses()
