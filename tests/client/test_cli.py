"""`trainguard restart|incidents|incident|approve|reject|cordon|uncordon` against a real
server: what each prints (a table, or JSON with --json), what it changes on the server,
and one line with a non-zero exit, never a traceback, for every failure."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from tests.client.conftest import Server
from tests.frontend.seed import JobSeed
from tests.support import free_port, wait_for
from trainguard.agent.cli import app


def _one_line_error(got: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert got.returncode == code, (got.returncode, got.stdout, got.stderr)
    assert got.stdout == "" and "Traceback" not in got.stderr, got.stderr
    [line] = got.stderr.splitlines()
    assert line.startswith("trainguard: "), line
    return line


def _json(got: subprocess.CompletedProcess[str]) -> object:
    assert got.returncode == 0, (got.stdout, got.stderr)
    return json.loads(got.stdout)


def test_a_restart_opens_an_incident_whose_timeline_the_incident_command_shows(
    server: Server,
) -> None:
    job = JobSeed("cli-restart", ["cli-node-1", "cli-node-2"], steps=5, launcher="torchrun")
    server.feed(job)
    got = server.cli("restart", job.name, "--level", "launcher", "--reason", "loss spike")
    assert got.returncode == 0, got.stderr
    [line] = got.stdout.splitlines()
    assert line.startswith("incident ") and "launcher restart of cli-restart (open)" in line
    incident_id = int(line.split()[1].rstrip(":"))

    # The node's executor acks its phases, as an agent would.
    [command, *_] = server.api("GET", f"incidents/{incident_id}")["commands"]
    t0 = time.time()
    for n, phase in enumerate(("delivered", "torn_down", "restarted")):
        ack = {"phase": phase, "ts": t0 + n * 0.5, "node": command["node"]}
        server.api("POST", f"commands/{command['id']}/acks", ack)

    shown = server.cli("incident", str(incident_id))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == [
        *("incident", str(incident_id), "job", job.name, "status", "open", "level", "launcher"),
    ]
    assert "trigger manual by admin" in lines[1]
    assert "reason loss spike" in shown.stdout
    header = next(i for i, row in enumerate(lines) if row.startswith("TIME (UTC)"))
    assert lines[header].split() == ["TIME", "(UTC)", "+S", "WHAT", "DETAIL"]
    # TIME is a date and a time: WHAT is the fourth word of a row.
    whats = [row.split()[3] for row in lines[header + 1 :]]
    # The recovery marks in their order, each phase's ack beside its mark.
    marks = [w for w in whats if w in ("fault", "detected", "decided", "delivered", "torn_down")]
    assert marks[:3] == ["fault", "detected", "decided"]
    assert marks[3:] == ["delivered", "torn_down"]
    assert whats.count("ack") == 3
    assert lines[header + 1].split()[2:4] == ["+0.000", "fault"]

    data = _json(server.cli("incident", str(incident_id), "--json"))
    assert isinstance(data, dict)
    assert data["id"] == incident_id and data["level"] == "launcher"
    assert data["timeline"]["torn_down_at"] == pytest.approx(t0 + 0.5)
    assert [a["phase"] for a in data["commands"][0]["acks"]] == [
        "delivered",
        "torn_down",
        "restarted",
    ]


def test_incidents_lists_newest_first_and_filters_by_job_and_status(server: Server) -> None:
    jobs = [
        JobSeed(f"cli-list-{n}", [f"cli-list-node-{n}"], steps=3, launcher="torchrun")
        for n in range(2)
    ]
    ids = {}
    for job in jobs:
        server.feed(job)
        got = server.cli("restart", job.name, "--level", "launcher", "--reason", "r", "--json")
        ids[job.name] = _json(got)["id"]  # type: ignore[index]  # --json prints an object

    table = server.cli("incidents")
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split()[:5] == ["ID", "JOB", "STATUS", "LEVEL", "TRIGGER"]
    listed = [int(r.split()[0]) for r in rows]
    assert listed == sorted(listed, reverse=True)
    assert {ids["cli-list-0"], ids["cli-list-1"]} <= set(listed)

    one = _json(server.cli("incidents", "--job", "cli-list-1", "--json"))
    assert [i["id"] for i in one] == [ids["cli-list-1"]]
    opened = _json(server.cli("incidents", "--status", "open", "--json"))
    assert {i["status"] for i in opened} == {"open"}
    assert server.cli("incidents", "--job", "cli-list-0", "--status", "resolved").stdout == (
        "no incidents\n"
    )

    # A page at a time: the next page's cursor on stderr, and every incident once.
    first = server.cli("incidents", "--limit", "1", "--json")
    [older] = [line for line in first.stderr.splitlines() if line.startswith("older incidents")]
    cursor = older.removeprefix("older incidents: --cursor ")
    second = _json(server.cli("incidents", "--limit", "1", "--cursor", cursor, "--json"))
    assert [i["id"] for i in _json(first) + second] == listed[:2]  # type: ignore[operator]  # lists
    bad = server.cli("incidents", "--cursor", "not-a-cursor")
    assert "cursor" in _one_line_error(bad)


def test_cordon_and_uncordon_change_the_nodes_state(server: Server) -> None:
    server.feed(JobSeed("cli-cordon", ["cli-cordon-node", "cli-cordon-other"], steps=2))
    # The node hosts live ranks: without --force, one line and a non-zero exit.
    got = server.cli("cordon", "cli-cordon-node", "--reason", "ECC errors")
    assert got.returncode == 1 and got.stdout == "", got
    assert got.stderr.count("\n") == 1 and "send force: true (CLI: --force)" in got.stderr
    assert server.api("GET", "nodes/cli-cordon-node")["cordoned"] is False
    got = server.cli("cordon", "cli-cordon-node", "--reason", "ECC errors", "--force")
    assert got.returncode == 0, got.stderr
    assert re.fullmatch(
        r"node cli-cordon-node: cordoned; it leaves its jobs \(incident \d+\)\n", got.stdout
    ), got.stdout
    node = server.api("GET", "nodes/cli-cordon-node")
    assert node["cordoned"] is True
    [cordon] = server.api("GET", "nodes/cli-cordon-node/cordons")
    assert "ECC errors" in json.dumps(cordon)

    again = server.cli("cordon", "cli-cordon-node", "--reason", "ECC errors")
    assert (again.returncode, again.stdout) == (
        0,
        "node cli-cordon-node: was already cordoned; nothing to do\n",
    ), again.stderr

    got = server.cli("uncordon", "cli-cordon-node", "--reason", "DIMM swapped", "--json")
    assert _json(got) == {
        "name": "cli-cordon-node",
        "cordoned": False,
        "changed": True,
        "incidents": [],
    }
    assert server.api("GET", "nodes/cli-cordon-node")["cordoned"] is False


def test_uncordon_of_a_node_that_is_not_cordoned_says_so_neutrally(server: Server) -> None:
    # Issue #33: "node X: not cordoned" read like an error after the operator's uncordon.
    server.feed(JobSeed("cli-free", ["cli-free-node"], steps=2))
    got = server.cli("uncordon", "cli-free-node", "--reason", "after the upgrade")
    assert (got.returncode, got.stdout, got.stderr) == (
        0,
        "node cli-free-node: was not cordoned; nothing to do\n",
        "",
    )
    got = server.cli("uncordon", "cli-free-node", "--reason", "again", "--json")
    assert _json(got) == {
        "name": "cli-free-node",
        "cordoned": False,
        "changed": False,
        "incidents": [],
    }


def _pending_incident(server: Server, job: JobSeed) -> int:
    """An exception on one of the job's ranks: the dry-run engine's recommendation."""
    server.feed(job)
    now = time.time()
    event = {"kind": "exception", "ts": now, "job": job.name, "rank": 1, "message": "NaN loss"}
    batch = {
        "node": job.nodes[0],
        "agent_id": f"exc-{job.name}",
        "seq": 1,
        "sent_at": now,
        "simulated": True,
        "events": [event],
    }
    server.api("POST", "ingest", batch)

    def pending() -> list[dict[str, object]]:
        got = server.cli("incidents", "--job", job.name, "--status", "pending", "--json")
        return _json(got)  # type: ignore[return-value]  # --json prints a list of objects

    [incident] = wait_for(pending, 30, 0.5)
    return int(incident["id"])


def test_approve_and_reject_answer_a_dry_run_recommendation(dry_run_server: Server) -> None:
    server = dry_run_server
    seeds = [
        JobSeed(f"cli-dry-{n}", [f"cli-dry-node-{n}"], steps=3, in_process=True) for n in range(2)
    ]
    approved, rejected = (_pending_incident(server, s) for s in seeds)

    got = server.cli("approve", str(approved), "--reason", "NaN loss, restart in place")
    assert got.returncode == 0, got.stderr
    assert got.stdout == f"incident {approved}: in_process approved (open)\n"
    answer = server.api("GET", f"incidents/{approved}")
    assert [d["why"] for d in answer["decisions"] if d.get("mode") == "approval"] == [
        "NaN loss, restart in place"
    ]

    got = server.cli("reject", str(rejected), "--json")
    data = _json(got)
    assert isinstance(data, dict) and data["status"] == "rejected"
    assert data["outcome"] == "rejected by admin: rejected by an operator"

    # Answered once: a second answer is the server's conflict, in one line.
    line = _one_line_error(server.cli("reject", str(approved)))
    assert "not awaiting approval" in line and "(HTTP 409)" in line


def test_an_unknown_job_or_incident_is_one_line_and_exit_1(server: Server) -> None:
    line = _one_line_error(
        server.cli("restart", "no-such-job", "--level", "launcher", "--reason", "x")
    )
    assert "no-such-job" in line and line.endswith("(HTTP 404)"), line
    line = _one_line_error(server.cli("incident", "999999"))
    assert line == "trainguard: no incident 999999 (HTTP 404)"
    line = _one_line_error(server.cli("cordon", "no-such-node", "--reason", "x"))
    assert line.endswith("(HTTP 404)"), line


def test_a_bad_or_missing_token_is_one_line(server: Server) -> None:
    line = _one_line_error(server.cli("incidents", token="not-a-token-of-this-server"))
    assert line.endswith("(HTTP 401)"), line
    line = _one_line_error(server.cli("incidents", token=None), code=2)
    assert line == "trainguard: no token: --token or TRAINGUARD_TOKEN"


def test_an_unreachable_server_is_one_line(server: Server) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    line = _one_line_error(server.cli("incidents", "--server", url))
    assert line == f"trainguard: cannot reach {url}: connection refused", line


def test_without_httpx_the_commands_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)
    monkeypatch.delitem(sys.modules, "trainguard.client.api", raising=False)
    got = CliRunner().invoke(app, ["incidents", "--token", "t"])
    assert (got.exit_code == 2 and got.exception is None) or isinstance(got.exception, SystemExit)
    assert got.output == (
        "trainguard: the operator commands need httpx: pip install 'trainguard[agent]'\n"
    )
