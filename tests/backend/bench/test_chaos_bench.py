"""`trainguard bench chaos`: the report's computation on synthetic rows (exact values), its
arguments, and one real run of about 2 minutes (slow: the server, two agents, the demo job
under faults, real processes; docs/benchmarks-chaos.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import wait_for
from trainguard.backend.bench.chaos import ChaosError, parse_config
from trainguard.backend.bench.chaos_checks import (
    Command,
    Cordon,
    Fault,
    NodeEvent,
    Step,
    invariants,
    judge_commands,
    judge_cordons,
    match_faults,
    observed_recovery,
    percentile,
    summary,
    timeline_problems,
)
from trainguard.backend.bench.chaos_report import build_report, state_disagreements, table
from trainguard.backend.models import TIMELINE

T = 1_800_000_000.0
ROOT = Path(__file__).resolve().parents[3]
CHAOS = [sys.executable, "-m", "trainguard.agent.cli", "bench", "chaos"]


def _incident(iid: int, fault_at: float | None, **kw: Any) -> dict[str, Any]:
    """An incident as GET /api/v1/incidents/{id} gives it; timeline offsets in seconds."""
    offsets = kw.pop("tl", {"detected_at": 0.1, "decided_at": 0.2, "delivered_at": 0.3})
    tl: dict[str, float | None] = {k: None for k in TIMELINE}
    if fault_at is not None:
        tl["fault_at"] = fault_at
        tl |= {k: fault_at + v for k, v in offsets.items()}
    resumed = tl["resumed_at"]
    return {
        "id": iid,
        "job": kw.pop("job", "j"),
        "created_at": (fault_at or T) + 0.1,
        "status": kw.pop("status", "resolved"),
        "outcome": kw.pop("outcome", "resumed"),
        "cause": kw.pop("cause", "exception"),
        "level": kw.pop("level", "in_process"),
        "node": kw.pop("node", None),
        "timeline": tl,
        "recovery_s": kw.pop(
            "recovery_s", resumed - fault_at if resumed is not None and fault_at else None
        ),
        "evidence": kw.pop("evidence", []),
    }


def _steps(job: str, node: str, ranks: list[int], start: float, end: float, gen=(0, 0)):
    """One step per rank every 0.5 s from `start` to `end`."""
    out = []
    t = start
    while t < end:
        out += [Step(job, node, r, t, t + 0.4, *gen) for r in ranks]
        t += 0.5
    return out


# --- wrongful cordons ------------------------------------------------------------------


def test_a_cordon_after_a_hard_xid_on_its_node_is_rightful_and_one_without_is_wrongful() -> None:
    cordons = [
        Cordon(T + 10, "n0", "engine", "incident 3: bucket RESTART_BM"),
        Cordon(T + 20, "n1", "engine", "incident 4: escalation after a failed launcher restart"),
        Cordon(T + 30, "n1", "alice", "maintenance"),  # an operator's: not judged
    ]
    events = [
        NodeEvent(T + 9.5, "n0", "xid", 79),  # hard, on n0, just before: n0's cordon rightful
        NodeEvent(T + 19.0, "n1", "xid", 13),  # soft (RESTART_APP): no evidence
        NodeEvent(T + 19.5, "n0", "gpu_lost", None),  # hard, but another node's
        NodeEvent(T + 25.0, "n1", "xid", 79),  # after the cordon: not its evidence
    ]
    out = judge_cordons(cordons, events, agent_deaths=[])
    assert (out["total"], out["wrongful"], out["by_others"]) == (2, 1, 1)
    rightful, wrongful = out["list"]
    assert rightful["rightful"] and rightful["evidence"] == ["xid 79 -0.5 s"]
    assert rightful["incident"] == 3
    assert not wrongful["rightful"] and wrongful["node"] == "n1" and wrongful["incident"] == 4
    assert out["wrongful_list"] == [wrongful]


def test_evidence_older_than_the_lookback_does_not_make_a_cordon_rightful() -> None:
    cordon = [Cordon(T + 200, "n0", "engine", "incident 1: x")]
    old = [NodeEvent(T + 50, "n0", "xid", 79)]  # 150 s before the cordon
    assert judge_cordons(cordon, old, [], lookback_s=120)["wrongful"] == 1
    assert judge_cordons(cordon, old, [], lookback_s=200)["wrongful"] == 0


def test_a_cordon_while_the_nodes_agent_was_dead_or_just_back_is_rightful() -> None:
    death = Fault("agent_death", T + 100, "j", "n0", down_s=20.0)  # dead T+100 .. T+120
    during = Cordon(T + 116, "n0", "engine", "incident 2: policy causes.node_down")
    after = Cordon(T + 200, "n0", "engine", "incident 3: policy causes.node_down")
    late = Cordon(T + 300, "n0", "engine", "incident 4: ?")  # 180 s after it came back
    other = Cordon(T + 116, "n1", "engine", "incident 5: ?")
    out = judge_cordons([during, after, late, other], [], [death], lookback_s=120)
    assert {r["incident"]: r["rightful"] for r in out["list"]} == {
        2: True,
        3: True,
        4: False,
        5: False,
    }
    assert out["list"][0]["evidence"] == ["agent killed -16.0 s, dead 20.0 s"]


# --- wrongful commands -----------------------------------------------------------------


def test_a_command_to_a_node_without_the_jobs_recent_steps_is_wrongful() -> None:
    steps = _steps("j", "n0", [0, 1], T, T + 50) + _steps("other", "n1", [0], T, T + 60)
    commands = [
        Command("c0", "j", "n0", "launcher", T + 60, 7),  # n0 stepped 10 s before: rightful
        Command("c1", "j", "n1", "launcher", T + 60, 7),  # only another job's steps on n1
        Command("c2", "j", "n0", "launcher", T + 200, 8),  # the job left n0 150 s before
        Command("c3", "j", "n2", "in_process", T + 61, 9),  # a job event from n2 counts
    ]
    events = [NodeEvent(T + 55, "n2", "exception", None, job="j")]
    out = judge_commands(commands, steps, events, host_window_s=60)
    assert (out["total"], out["wrongful"]) == (4, 2)
    assert [(c["id"], c["last_report_s_before"]) for c in out["wrongful_list"]] == [
        ("c1", None),
        ("c2", 150.1),
    ]


# --- recovery percentiles --------------------------------------------------------------


def test_percentiles_are_linear_between_the_closest_ranks() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert percentile(xs, 50) == pytest.approx(50.5)
    assert percentile(xs, 99) == pytest.approx(99.01)
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert percentile([4.0, 1.0, 3.0, 2.0], 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    assert summary([2.0, None, 1.0, 10.0]) == {"n": 3, "p50": 2.0, "p99": 9.84, "max": 10.0}
    assert summary([None]) == {"n": 0, "p50": None, "p99": None, "max": None}


def test_observed_recovery_waits_for_a_newer_generation_before_the_next_fault() -> None:
    steps = (
        _steps("j", "n0", [0, 1], T, T + 10)  # attempt 0 until the fault at T + 10
        + _steps("j", "n0", [0, 1], T + 16, T + 20, gen=(1, 0))  # the launcher restart
    )
    steps.sort(key=lambda s: s.end)
    f = Fault("sigkill", T + 10.2, "j", "n0", rank=1, step=20, index=0)
    assert observed_recovery(f, steps, until=T + 100) == pytest.approx(16.4 - 10.2, abs=1e-3)
    assert observed_recovery(f, steps, until=T + 15) is None  # the next fault came first
    xid = Fault("xid", T + 17.0, "j", "n0", rank=1)  # the job ran through it: no restart
    assert observed_recovery(xid, steps, until=T + 100) is None


# --- invariants ------------------------------------------------------------------------


def test_an_out_of_order_timeline_and_a_wrong_recovery_are_flagged() -> None:
    ok = _incident(1, T, tl={"detected_at": 0.1, "decided_at": 0.2, "resumed_at": 5.0})
    assert timeline_problems(ok) == []
    # demo incident #2 of issue 13: resumed before decided, recovery 1.32 s
    bad = _incident(2, T, tl={"detected_at": 0.1, "decided_at": 5.0, "resumed_at": 1.32})
    assert timeline_problems(bad) == ["resumed_at is 3.680 s before decided_at"]
    wrong = _incident(3, T, tl={"resumed_at": 5.0}, recovery_s=4.0)
    assert timeline_problems(wrong) == ["recovery_s 4.0 != resumed_at - fault_at = 5.000"]
    no_fault = _incident(4, None, recovery_s=2.0)
    assert timeline_problems(no_fault) == ["recovery_s 2.0 without both fault_at and resumed_at"]
    unresumed = _incident(5, T)  # resolved, but no resumed_at
    out = invariants([ok, bad, wrong, no_fault, unresumed])
    assert out["checked"] == 5
    assert [v["incident"] for v in out["violations"]] == [2, 3, 4]
    assert out["resolved_without_resumed_at"] == [4, 5]


# --- faults and incidents --------------------------------------------------------------


def test_each_fault_gets_the_incident_its_kind_and_rank_point_to() -> None:
    ev = {"kind": "rank_exit", "cause": "rank_exit", "node": "n1", "rank": 3}
    faults = [
        Fault("sigkill", T + 10, "j", "n1", rank=3, step=40, index=0),
        # an XID 5 s later whose evidence joined the open incident of the exception before
        Fault("exception", T + 30, "j", "n0", rank=1, step=90, index=1),
        Fault("xid", T + 35, "j", "n0", rank=1, step=110, index=2),
        Fault("agent_death", T + 60, "j", "n1", down_s=8.0),  # back before node_down
        Fault("hang", T + 80, "j", "n1", rank=2, step=200, index=3),  # no incident
    ]
    incidents = [
        _incident(1, T + 10.3, cause="rank_exit", evidence=[ev]),
        _incident(2, T + 10.8, cause="heartbeat_lost"),  # a second incident of the SIGKILL
        _incident(
            3,
            T + 30.1,
            evidence=[
                {"kind": "exception", "cause": "exception", "rank": 1, "ts": T + 30.1},
                {"kind": "xid", "cause": "xid 79", "node": "n0", "ts": T + 35.1},
            ],
        ),
        _incident(4, T + 500, cause="exception"),  # no fault near it
        _incident(5, T + 10.3, job="other", cause="rank_exit"),  # another job's
    ]
    m = match_faults(faults, incidents)
    assert m["incident_of"] == {0: 1, 1: 3}
    assert m["shared"] == {2: 3}  # the XID's evidence is in the exception's incident
    assert m["extra"] == {2: "j#0"}
    assert m["unexplained"] == [4, 5]


def test_the_report_accounts_for_every_fault_and_flags_what_the_steps_contradict() -> None:
    steps = (
        _steps("j", "n0", [0, 1], T, T + 10)
        + _steps("j", "n0", [0, 1], T + 15, T + 40, gen=(1, 0))
        + _steps("j", "n0", [0, 1], T + 62, T + 70, gen=(1, 1))
    )
    faults = [
        Fault("sigkill", T + 10.1, "j", "n0", rank=1, index=0),
        Fault("xid", T + 30.0, "j", "n0", rank=1, index=1),
        # Long enough to be judged, but its ranks trained on: an alert, no incident.
        Fault("agent_death", T + 45.0, "j", "n1", down_s=20.0),
        Fault("exception", T + 50.0, "j", "n0", rank=1, index=2, agent_down=True),
    ]
    incidents = [
        _incident(1, T + 10.3, cause="rank_exit", tl={"resumed_at": 5.0}),
        # failed, "no node hosts live ranks", while the job trained on
        _incident(2, T + 30.05, cause="xid 79", status="failed", outcome="no node hosts x"),
        # resolved 3 s after it, and the job made no step until T + 62
        _incident(3, T + 55.0, cause="exception", tl={"resumed_at": 3.0}),
        _incident(4, T + 121.0, cause="rank_exit"),  # after the stop: not judged
    ]
    report = build_report(
        faults=faults,
        incidents=incidents,
        steps=steps,
        commands=[Command("c", "j", "n0", "launcher", T + 10.5, 1)],
        cordons=[Cordon(T + 31, "n0", "engine", "incident 2: bucket RESTART_BM")],
        node_events=[NodeEvent(T + 30.0, "n0", "xid", 79)],
        observations=[],
        start=T,
        stop=T + 120,
    )
    acc = report["faults"]["accounted"]
    assert acc == {
        "injected": 4,
        "with_incident": 3,
        "sharing_an_incident": 0,
        "without_incident": 0,
        "needing_no_incident": 1,
        "with_an_undue_incident": 0,
    }
    vs = report["api_vs_processes"]
    assert vs["faults_without_incident"] == []
    assert [f["kind"] for f in vs["faults_needing_no_incident"]] == ["agent_death"]
    assert [x["incident"] for x in vs["failed_but_resumed"]] == [2]
    assert vs["resolved_without_step"] == []  # it stepped at T + 62, before the stop
    assert report["incidents"]["by_status"] == {"resolved": 2, "failed": 1}
    assert report["incidents"]["by_outcome"]["failed"] == {"no node hosts x": 1}
    assert report["after_stop"] == {"incidents": 1, "commands": 0, "cordons": 0}
    assert report["wrongful"]["cordons"]["wrongful"] == 0
    assert report["wrongful"]["commands"]["wrongful"] == 0
    rec = report["recovery"]
    assert rec["sigkill"]["api_recovery_s"]["p50"] == 5.0
    assert rec["sigkill"]["observed_recovery_s"]["p50"] == pytest.approx(5.3, abs=1e-3)
    assert rec["exception"]["api_recovery_s"]["p50"] == 3.0
    assert rec["agent_death"]["api_recovery_s"]["n"] == 0
    assert report["invariants"]["violations"] == []
    assert "wrongful cordons: 0 of 1" in table({**report, **_head()})


def test_resolved_with_no_step_after_it_is_flagged() -> None:
    steps = _steps("j", "n0", [0, 1], T, T + 10)
    inc = _incident(1, T + 10.2, cause="hang", tl={"resumed_at": 2.0})
    report = build_report(
        faults=[Fault("hang", T + 10.1, "j", "n0", rank=1, index=0)],
        incidents=[inc],
        steps=steps,
        commands=[],
        cordons=[],
        node_events=[],
        observations=[],
        start=T,
        stop=T + 60,
    )
    assert [x["incident"] for x in report["api_vs_processes"]["resolved_without_step"]] == [1]


def _head() -> dict[str, Any]:
    return {"config": {"seed": 1}, "runs": [], "interrupted": False}


# --- the API's state against the processes ---------------------------------------------


def _obs(ts: float, alive: bool, since: float, status: str, procs: list, api: list) -> dict:
    node = {
        "agent_alive": alive,
        "agent_since": since,
        "api_status": status,
        "api_last_seen": ts,
        "proc_ranks": procs,
        "api_ranks": api,
    }
    return {"ts": ts, "nodes": {"n0": node}, "jobs": {}}


def test_state_disagreements_count_only_when_they_outlast_their_grace() -> None:
    # the agent dead from T; the API still says healthy 30 s later (down_after 15 s)
    dead = [_obs(T + t, False, T, "healthy", [], []) for t in range(0, 32, 2)]
    out = state_disagreements(dead, down_after_s=15)
    assert out["by_kind"] == {"node_up_agent_dead": 1}
    (ep,) = out["episodes"]
    assert (ep["from"], ep["to"]) == (T + 16, T + 30)
    # marked down in time: no disagreement
    down = [_obs(T + t, False, T, "down" if t > 15 else "healthy", [], []) for t in range(0, 32, 2)]
    assert state_disagreements(down, down_after_s=15)["episodes"] == []
    # a live worker (rank 2, pid 100, 60 s old) the API does not know: for 8 s it is a
    # blip, for 24 s a disagreement
    procs = [[2, 100, 60.0]]
    short = [_obs(T + t, True, T - 100, "healthy", procs, []) for t in range(0, 10, 2)]
    long_ = [_obs(T + t, True, T - 100, "healthy", procs, []) for t in range(0, 26, 2)]
    assert state_disagreements(short, 15)["episodes"] == []
    assert state_disagreements(long_, 15)["by_kind"] == {"ranks": 1}
    # a worker still importing torch (3 s old) has not said hello yet: no disagreement
    young = [_obs(T + t, True, T - 100, "healthy", [[2, 100, 3.0]], []) for t in range(0, 26, 2)]
    assert state_disagreements(young, 15)["episodes"] == []
    # the API calls rank 1 (pid 50) alive; no such process
    gone = [
        _obs(T + t, True, T - 100, "healthy", procs, [[2, 100], [1, 50]]) for t in range(0, 26, 2)
    ]
    (ep,) = state_disagreements(gone, 15)["episodes"]
    assert ep["detail"] == "(rank, pid) unknown to the API [], gone but alive in it [(1, 50)]"


# --- arguments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("abc", "1"), "--minutes takes a number, not 'abc'"),
        (("0.1", "1"), "--minutes must be between 0.5 and 1440, not 0.1"),
        (("2", "x"), "--seed takes a number, not 'x'"),
        (("2", "1", "10"), "--bench-every must be 0 or at least 30 s"),
        (
            ("2", "1", "90", "800", "5", "boom"),
            "--kinds: unknown fault kind 'boom'; choose from exception, hang, sigkill, slow, xid",
        ),
        (
            ("2", "1", "90", "800", "5", "xid", "agent_kill"),
            "--bench-kinds: unknown kind "
            "'agent_kill'; choose from agent_death, agent_stop, user_sigterm, manual_restart",
        ),
    ],
)
def test_bad_arguments_are_refused_with_one_line(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(ChaosError) as exc:
        parse_config(*args)
    assert str(exc.value) == message


def test_the_cli_refuses_bad_arguments_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    for argv, line in [
        (["--minutes", "abc"], "trainguard: --minutes takes a number, not 'abc'"),
        (
            ["--steps", "100"],
            "trainguard: bad fault plan: 5 faults do not fit between step 20 "
            "and 100 with a gap of 100",
        ),
        (
            ["--out", str(tmp_path / "no" / "r.json")],
            f"trainguard: --out: no directory {tmp_path / 'no'}",
        ),
    ]:
        p = subprocess.run(
            [*CHAOS, *argv],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        assert p.returncode == 2
        lines = [x for x in p.stderr.splitlines() if "trainguard:" in x or "Traceback" in x]
        assert lines == [line]


# --- a real run ------------------------------------------------------------------------


def _left_behind(mark: str) -> list[str]:
    """Processes whose command line or environment mentions `mark` (the bench's work dir)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (mark.encode() in cmd or mark.encode() in env):
            words = cmd.replace(b"\0", b" ").decode(errors="replace")
            out.append(f"{pid}: {words[:200]}")
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_two_minute_run_accounts_for_every_fault_and_replays_exactly(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "report.json"
    args = ["--minutes", "2", "--seed", "2", "--bench-every", "50"]  # xid, hang, exception early
    p = subprocess.run(
        [*CHAOS, *args, "--workdir", str(work), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=540,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert _left_behind(str(work)) == []
    report = json.loads(out.read_text())
    for section in ("incidents", "wrongful", "recovery", "api_vs_processes", "invariants"):
        assert section in report
    acc = report["faults"]["accounted"]
    assert acc["injected"] >= 3
    outside = ("agent_death", "agent_stop", "user_sigterm", "manual_restart")
    assert sum(report["faults"]["by_kind"].get(k, 0) for k in outside) >= 1
    assert acc["injected"] == (
        acc["with_incident"]
        + acc["sharing_an_incident"]
        + acc["without_incident"]
        + acc["needing_no_incident"]
        + acc["with_an_undue_incident"]
    )
    vs = report["api_vs_processes"]
    for f in report["faults"]["list"]:  # each fault: its incident, or listed without one
        listed = vs["faults_without_incident"] + vs["faults_needing_no_incident"]
        assert (f["incident"] is not None) != (f["fault"] in {x["fault"] for x in listed})
    for name in ("cordoned_while_stepping", "job_state_vs_launcher", "goodput_after_end"):
        assert report["false_states"][name]["count"] >= 0  # present; zero is not asserted
    assert sum(r["faults"] for r in report["recovery"].values()) == acc["injected"]
    assert report["invariants"]["checked"] == report["incidents"]["total"]
    assert report["incidents"]["read_from"] == "api"
    assert report["wrongful"]["cordons"]["total"] >= 0  # present; zero is not asserted here
    assert "faults injected:" in p.stdout and "| fault kind |" in p.stdout
    print(p.stdout)  # the run's table, for the record (pytest -s)
    total = report["incidents"]["total"] + report["after_stop"]["incidents"]
    _replays_its_own_record(work, tmp_path, total)


def _replays_its_own_record(work: Path, tmp_path: Path, incidents: int) -> None:
    """The run's period, exported from the server's database, replayed under the policy
    file the server ran with (docs/replay.md, "Proof over a chaos run"): every recorded
    decision is reproduced."""
    env = {
        **os.environ,
        "TRAINGUARD_DATA_DIR": str(work / "server" / "data"),
        "TRAINGUARD_POLICY_FILE": str(work / "policy.toml"),
    }
    env.pop("TRAINGUARD_DATABASE_URL", None)
    policy = [sys.executable, "-m", "trainguard.agent.cli", "policy"]
    tr, rep = tmp_path / "chaos.jsonl", tmp_path / "replay.json"
    for argv in (
        ["export", "--since", "2h", "--out", str(tr)],
        ["replay", "--policy", str(work / "policy.toml"), "--trace", str(tr), "--json", str(rep)],
    ):
        p = subprocess.run(
            [*policy, *argv], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600
        )
        assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(rep.read_text())
    # every automatic incident of the run (the operator's restarts are not replayed)
    records = [json.loads(line) for line in tr.read_text().splitlines()[1:]]
    recorded = [r for r in records if r["t"] == "incident"]
    assert len(recorded) == incidents
    auto = {
        (r["job"], r["cause"], r["node"] or None, round(r["fault_at"], 6))
        for r in recorded
        if r["trigger"] == "auto"
    }
    compared = {
        (r["job"], r["cause"], r["node"], r["fault_at"]) for r in out["incidents"] if r["recorded"]
    }
    assert auto and compared == auto  # the report holds every recorded incident
    print(p.stdout)
    wrong = [r for r in out["incidents"] if not r["self_check"]]
    if wrong:
        # Known gap (docs/replay.md, "Proof over a chaos run"): around an agent's death
        # the replay may judge a silence or a merge otherwise than the live engine did.
        pytest.xfail(f"self-check: {len(wrong)} of {len(out['incidents'])} differ: {wrong}"[:3000])
    assert out["self_check"]["exact"] is True


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sigterm_stops_every_process_the_bench_started(tmp_path: Path) -> None:
    work = tmp_path / "work"
    proc = subprocess.Popen(
        [*CHAOS, "--minutes", "10", "--workdir", str(work), "--bench-every", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # the job trains (or the bench exited: its output says why)
        ckpts = work / "job-1" / "checkpoints"
        wait_for(lambda: proc.poll() is not None or list(ckpts.glob("step_*")), 300, every=0.5)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert _left_behind(str(work))  # the job runs
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output[-3000:]
    assert "INTERRUPTED" in output
    assert wait_for(lambda: _left_behind(str(work)) == [], 30)
