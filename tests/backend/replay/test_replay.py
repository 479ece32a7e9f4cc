"""Policy replay (backend/replay): a period recorded on the simulated cluster (real app,
real ingest, the real engine on a test clock) is exported from the live database and
replayed through the real engine on a scratch database. Under the policy in force it
must reproduce every recorded decision; under a candidate it shows what would differ;
it never writes the live tables."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from tests.backend.engine.conftest import FRESH_S
from trainguard.backend.engine.policy import load_policy, load_policy_text
from trainguard.backend.models import Base
from trainguard.backend.replay import cli, report, service, trace
from trainguard.protocol import wire

LIMITS = service.Limits(max_events=100_000, max_incidents=10_000)
LOWER_CAP = "[breaker]\nmax_fraction = 0.125\n"


def _mixed_period(c: Any) -> None:
    """Two jobs on four nodes: an exception (in_process), a rank death during the episode
    (escalated to launcher), an XID 79 (exclusion), all acked by their agents."""
    c.job("a", {"n1": (0, 1), "n2": (2, 3)})
    c.job("b", {"n3": (0,), "n4": (1,)})
    c.clock.advance(5)
    c.event("n1", "exception", job="a", rank=0, message="boom")
    c.decide()
    c.clock.advance(1)
    c.recover()
    c.clock.advance(1)
    c.decide()
    c.clock.advance(30)
    c.job("a", {"n1": (0, 1), "n2": (2, 3)}, step=20)
    c.clock.advance(30)
    c.event("n2", "exception", job="a", rank=2, message="nccl")
    c.decide()
    c.clock.advance(0.5)
    c.exited("n2", "a", (3,), code=1)
    c.decide()
    c.clock.advance(1)
    c.recover()
    c.clock.advance(1)
    c.decide()
    c.clock.advance(30)
    c.event("n3", "xid", xid=79, gpu_uuid="GPU-n3-0")
    c.decide()
    c.clock.advance(1)
    c.recover()
    c.clock.advance(3)
    c.decide()


def _three_xid79s(c: Any) -> None:
    """Eight nodes, four jobs; XID 79 on three nodes of three jobs: the breaker's cap
    (max(1, 25 % of 8) = 2) lets two cordons through and holds the third."""
    for i in range(4):
        c.job(f"j{i}", {f"n{2 * i}": (0,), f"n{2 * i + 1}": (1,)})
    for i in range(3):
        c.clock.advance(5)
        c.event(f"n{2 * i}", "xid", xid=79, gpu_uuid=f"GPU-n{2 * i}-0")
        c.decide()
        c.clock.advance(1)
        c.recover()
        c.clock.advance(3)
        c.decide()


def _export(c: Any, start: float) -> trace.Trace:
    with c.engine.sessions() as s:
        return service.export(s, start - 1, c.clock.t + 1, None)


def _replay(tr: trace.Trace, candidate: str | None = None, tmp: Path | None = None) -> Any:
    return service.replay(
        tr,
        load_policy(None),
        load_policy_text(candidate, "candidate") if candidate is not None else None,
        limits=LIMITS,
        fresh_within_s=FRESH_S,
        folder=tmp,
    )


@pytest.mark.parametrize("scenario", [_mixed_period, _three_xid79s])
def test_replay_under_the_policy_in_force_reproduces_every_recorded_decision(
    make_cluster: Any, scenario: Any, tmp_path: Path
) -> None:
    c = make_cluster()
    start = c.clock.t
    scenario(c)
    recorded = c.incidents()
    assert recorded, "the scenario recorded incidents"
    out = _replay(_export(c, start), tmp=tmp_path)
    assert out["self_check"] == {"incidents": len(recorded), "mismatches": 0, "exact": True}
    for row in out["incidents"]:
        rec, cur = row["recorded"], row["current"]
        assert (rec["actions"], rec["cordons"], rec["status"]) == (
            cur["actions"],
            cur["cordons"],
            cur["status"],
        )
    # The record is the engine's, read through the API: the same incidents, causes, levels.
    by_key = {(r["job"], r["cause"], r["fault_at"]): r for r in out["incidents"]}
    for inc in recorded:
        row = by_key[(inc["job"], inc["cause"], round(inc["timeline"]["fault_at"], 6))]
        assert row["current"]["level"] == inc["level"]
        assert row["current"]["decisions"] == [[d["level"], d["mode"]] for d in inc["decisions"]]


def test_a_candidate_that_lowers_the_breakers_cap_shows_the_holds_it_would_cause(
    make_cluster: Any, tmp_path: Path
) -> None:
    c = make_cluster()
    start = c.clock.t
    _three_xid79s(c)
    out = _replay(_export(c, start), LOWER_CAP, tmp_path)
    tot = out["totals"]
    assert tot["recorded"]["cordons"] == tot["current"]["cordons"] == 2
    assert tot["recorded"]["breaker_holds"] == tot["current"]["breaker_holds"] == 1
    assert tot["candidate"]["cordons"] == 1
    assert tot["candidate"]["breaker_holds"] == 2
    held = [r for r in out["incidents"] if r["differs"]]
    assert [(r["node"], r["current"]["cordons"], r["candidate"]["status"]) for r in held] == [
        ("n2", ["n2"], "pending")
    ]
    assert out["differences"] == 1
    # Each row names the live incident it replays (its page), the record's own id.
    live = {(i["node"], i["id"]) for i in c.incidents()}
    assert {(r["node"], r["incident_id"]) for r in out["incidents"]} == live
    assert out["policy_changes"] == [
        {"key": "breaker.max_fraction", "current": 0.25, "candidate": 0.125}
    ]


def test_policy_changes_name_each_key_and_never_show_a_hook_command() -> None:
    current = load_policy(None)
    candidate = load_policy_text(
        '[limits]\ncooldown_s = 0\n[hooks]\ncordon = "ssh admin@bmc drain {node}"\n'
        '[causes]\nhang = { action = "launcher", shadow = true }\n',
        "candidate",
    )
    assert report.policy_changes(current, candidate) == [
        {"key": "causes.hang (shadow)", "current": None, "candidate": "launcher"},
        {"key": "hooks.cordon", "current": "empty", "candidate": "set"},
        {"key": "limits.cooldown_s", "current": 10.0, "candidate": 0.0},
    ]
    assert report.policy_changes(current, current) == []


def _live_tables(url_sessions: Any) -> dict[str, tuple[int, str]]:
    """Row count and checksum of every table of the live database."""
    out = {}
    with url_sessions() as s:
        for table in Base.metadata.sorted_tables:
            rows = s.execute(select(table).order_by(*table.primary_key.columns or table.c)).all()
            digest = hashlib.sha256(repr([tuple(r) for r in rows]).encode()).hexdigest()
            count = s.scalar(select(func.count()).select_from(table))
            out[table.name] = (int(count or 0), digest)
    return out


def test_replay_through_the_api_never_writes_the_live_tables(make_cluster: Any) -> None:
    c = make_cluster(node_down_after_s=FRESH_S)
    start = c.clock.t
    _three_xid79s(c)
    before = _live_tables(c.engine.sessions)
    r = c.client.post(
        "/api/v1/policy/replay",
        json={"policy": LOWER_CAP, "since": start - 1, "until": c.clock.t + 1},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["self_check"]["exact"] is True
    assert body["totals"]["candidate"]["breaker_holds"] == 2
    assert {r["incident_id"] for r in body["incidents"]} == {i["id"] for i in c.incidents()}
    assert body["policy_changes"][0]["key"] == "breaker.max_fraction"
    assert _live_tables(c.engine.sessions) == before
    assert before["incidents"][0] == 3


def test_bad_input_is_refused_with_the_reason(make_cluster: Any) -> None:
    c = make_cluster(replay_max_events=2)
    start = c.clock.t
    _three_xid79s(c)
    url = "/api/v1/policy/replay"
    span = {"since": start - 1, "until": c.clock.t + 1}
    r = c.client.post(url, json={"policy": "[breaker]\nmax_fraction = 2\n", **span})
    assert r.status_code == 422
    assert "breaker.max_fraction" in r.json()["detail"]
    assert r.json()["code"] == "bad_policy"
    r = c.client.post(url, json={"policy": "", "since": start - 500, "until": start - 100})
    assert r.status_code == 422
    assert r.json()["code"] == "no_evidence"
    assert "no evidence" in r.json()["detail"]
    r = c.client.post(url, json={"policy": "", **span})
    assert r.status_code == 413
    assert (
        "limit of 2" in r.json()["detail"] and "TRAINGUARD_REPLAY_MAX_EVENTS" in r.json()["detail"]
    )
    r = c.client.post(url, json={"policy": ""})
    assert r.status_code == 422


def test_a_trace_file_round_trips_redacted_and_a_newer_version_is_refused(
    make_cluster: Any, tmp_path: Path
) -> None:
    c = make_cluster()
    start = c.clock.t
    _three_xid79s(c)
    with c.engine.sessions() as s:
        tr = service.export(s, start - 1, c.clock.t + 1, None, redact=True)
    path = tmp_path / "period.jsonl"
    trace.save(tr, path)
    text = path.read_text()
    assert '"n0"' not in text and "GPU-n0-0" not in text and "node-1" in text
    back = trace.load(path)
    assert back.redacted and {k: len(v) for k, v in back.records.items()} == {
        k: len(v) for k, v in tr.records.items()
    }
    # Redacted names are consistent: the replay still reproduces the record.
    assert _replay(back, tmp=tmp_path / "r")["self_check"]["exact"] is True
    head, *rest = text.splitlines()
    newer = json.loads(head) | {"version": trace.VERSION + 1}
    path.write_text("\n".join([json.dumps(newer), *rest]))
    with pytest.raises(trace.TraceError, match=f"version {trace.VERSION + 1} is newer"):
        trace.load(path)


def test_the_cli_exports_and_replays_and_refuses_bad_input_in_one_line(
    make_cluster: Any, db_url: str, tmp_path: Path
) -> None:
    c = make_cluster()
    start = c.clock.t
    _three_xid79s(c)
    run = CliRunner().invoke
    env = {"TRAINGUARD_DATABASE_URL": db_url, "TRAINGUARD_NODE_DOWN_AFTER_S": str(FRESH_S)}
    span = ["--from", str(start - 1), "--to", str(c.clock.t + 1)]
    out = tmp_path / "t.jsonl"
    r = run(cli.app, ["export", "--out", str(out), *span], env=env)
    assert r.exit_code == 0, r.output
    assert f"trainguard-trace v{trace.VERSION}" in r.output
    cand = tmp_path / "cand.toml"
    cand.write_text(LOWER_CAP)
    r = run(cli.app, ["replay", "--policy", str(cand), "--trace", str(out)], env=env)
    assert r.exit_code == 0, r.output
    assert "self-check (record vs policy in force): exact" in r.output
    # The totals' table: candidate, 3 incidents, 1 cordon, 2 breaker holds.
    assert re.search(r"^candidate\s+3\s+1\s+2\s", r.output, re.M), r.output
    bad = tmp_path / "bad.toml"
    bad.write_text("[breaker]\nmax_fraction = -1\n")
    r = run(cli.app, ["replay", "--policy", str(bad), *span], env=env)
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and "breaker.max_fraction" in r.output
    r = run(cli.app, ["replay", "--policy", str(cand), "--from", "1000", "--to", "2000"], env=env)
    assert r.exit_code == 2 and "no evidence" in r.output and r.output.count("\n") == 1


def test_a_period_that_ends_while_its_nodes_report_judges_no_silence_after_its_end(
    make_cluster: Any, tmp_path: Path
) -> None:
    """The record ends with the period, not the nodes: the replay's run-on after its end
    must not take the nodes' silence for a node death (the first to fall silent would look
    down beside its job's peers)."""
    c = make_cluster()
    start = c.clock.t
    c.job("a", {"n0": (0,), "n1": (1,)})
    c.clock.advance(5)
    c.job("a", {"n0": (0,)}, step=11)
    c.clock.advance(8)
    c.job("a", {"n1": (1,)}, step=11)
    c.event("n1", "exception", job="a", rank=1, message="boom")
    c.decide()
    c.clock.advance(1)
    c.recover()
    c.clock.advance(1)
    c.decide()
    with c.engine.sessions() as s:
        tr = service.export(s, start - 1, c.clock.t + 1, None)
    out = service.replay(
        tr, load_policy(None), None, limits=LIMITS, fresh_within_s=30.0, folder=tmp_path
    )
    assert [r["cause"] for r in out["incidents"]] == ["exception"], out["incidents"]
    assert out["self_check"]["exact"] is True


READMIT = "[readmission]\nreadmit_after_s = 30\n[breaker]\nwindow_s = 20\n"


def _gpu(c: Any, node: str, lost: bool) -> None:
    uuid = f"GPU-{node}-0"
    sample = (
        wire.GpuSample(uuid=uuid, ts=c.clock.t)  # every reading missing: fallen off the bus
        if lost
        else wire.GpuSample(uuid=uuid, ts=c.clock.t, util=0.0, temp_c=31.0, power_w=60.0)
    )
    c.post(node, gpus=[wire.GpuInfo(uuid=uuid, index=0)], samples=[sample])


def test_a_node_readmitted_on_its_gpus_readings_and_cordoned_again_replays_exactly(
    make_cluster: Any, tmp_path: Path
) -> None:
    """Readmission reads the GPUs' samples: the trace keeps them as spans (lost, then
    healthy again after the reboot), and the replay readmits the node when the record did,
    so the second XID 79 cordons it again there too."""
    c = make_cluster(READMIT)
    start = c.clock.t
    c.job("job", {"n1": (0,), "n2": (1,)})
    for _ in range(2):
        _gpu(c, "n1", lost=False)
        c.event("n1", "xid", xid=79, gpu_uuid="GPU-n1-0")
        c.decide()
        c.clock.advance(1)
        c.recover()
        for lost in [True] * 4 + [False] * 8:  # lost until its reboot, then healthy 40 s
            c.clock.advance(5)
            _gpu(c, "n1", lost=lost)
            c.job("job", {"n1": (0,), "n2": (1,)}, step=30)
            c.decide()
    assert [i["cause"] for i in c.incidents()] == ["xid 79", "xid 79"]
    with c.engine.sessions() as s:
        tr = service.export(s, start - 1, c.clock.t + 1, None)
    assert {(sp["gpu"], sp["lost"]) for sp in tr["gpu_span"]} == {
        ("GPU-n1-0", False),
        ("GPU-n1-0", True),
    }
    policy = load_policy_text(READMIT, "in force")
    out = service.replay(tr, policy, None, limits=LIMITS, fresh_within_s=FRESH_S, folder=tmp_path)
    assert out["self_check"] == {"incidents": 2, "mismatches": 0, "exact": True}
    assert [r["current"]["cordons"] for r in out["incidents"]] == [["n1"], ["n1"]]
    assert out["totals"]["current"]["cordons"] == 2
    # Without the spans (a version 1 trace has none) the node is never readmitted: the
    # second XID finds it cordoned, and the self-check says so.
    tr.records["gpu_span"] = []
    out = service.replay(
        tr, policy, None, limits=LIMITS, fresh_within_s=FRESH_S, folder=tmp_path / "v1"
    )
    assert out["self_check"]["mismatches"] == 1


def test_a_version_1_trace_is_still_read(make_cluster: Any, tmp_path: Path) -> None:
    c = make_cluster()
    start = c.clock.t
    _three_xid79s(c)
    path = tmp_path / "v1.jsonl"
    trace.save(_export(c, start), path)
    head, *rest = path.read_text().splitlines()
    old = {k: v for k, v in json.loads(head).items() if k != "exported_at"} | {"version": 1}
    rest = [line for line in rest if json.loads(line)["t"] != "gpu_span"]
    path.write_text("\n".join([json.dumps(old), *rest]) + "\n")
    back = trace.load(path)
    assert (back.version, back.exported_at, back["gpu_span"]) == (1, None, [])
    assert _replay(back, tmp=tmp_path / "r")["self_check"]["exact"] is True


def test_an_agent_that_said_goodbye_is_replayed_as_gone_not_as_a_node_down(
    make_cluster: Any, tmp_path: Path
) -> None:
    """A silence after the agent's goodbye (a graceful stop) is no evidence: the trace
    keeps the batch's `going_away`, so the replay does not take the silence (its job
    stalled meanwhile) for a dead node."""
    down_after = 20.0
    c = make_cluster(fresh=down_after, node_down_after_s=down_after)
    start = c.clock.t
    c.job("job", {"n1": (0,), "n2": (1,)})
    c.decide()
    c.post("n1", going_away="SIGTERM: the agent is stopping")
    c.event("n2", "log", job="job", message="n1's agent stops")
    for _ in range(int(2 * down_after)):  # n2 reports its rank, no step: the job stalled
        c.clock.advance(1)
        c.post("n2", ranks=[wire.RankStatus(job="job", rank=1, pid=1001, world_size=2)])
        c.decide()
    assert c.incidents() == []
    tr = _export(c, start)
    assert [b.get("going_away") for b in tr["batch"] if b["node"] == "n1"][-1]
    policy = load_policy(None)
    kw: dict[str, Any] = {"limits": LIMITS, "fresh_within_s": down_after}
    out = service.replay(tr, policy, None, folder=tmp_path, **kw)
    assert out["self_check"] == {"incidents": 0, "mismatches": 0, "exact": True}
    for b in tr["batch"]:  # a record without the goodbye: the silence is a node down
        b.pop("going_away", None)
    out = service.replay(tr, policy, None, folder=tmp_path / "without", **kw)
    assert [(r["cause"], r["recorded"]) for r in out["incidents"]] == [("node_down", None)]
