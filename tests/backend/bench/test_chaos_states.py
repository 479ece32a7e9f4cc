"""The false states of `trainguard bench chaos` (backend/bench/chaos_states.py) and its
checks of the faults from outside the job, each on hand-made rows: one that is false and
counts, one that is true and reads 0."""

from __future__ import annotations

from typing import Any

from trainguard.backend.bench.chaos_checks import Cordon, Fault, Step
from trainguard.backend.bench.chaos_report import build_report, state_disagreements
from trainguard.backend.bench.chaos_states import (
    budget_answers,
    cordoned_while_stepping,
    goodput_after_end,
    job_state_vs_launcher,
    open_after_end,
)

T = 1_800_000_000.0


def _steps(node: str, rank: int, start: float, end: float, job: str = "j") -> list[Step]:
    """One step of `rank` every 0.5 s from `start` to `end`."""
    out, t = [], start
    while t < end:
        out.append(Step(job, node, rank, t, t + 0.4))
        t += 0.5
    return out


# --- 1. a node cordoned while its ranks step -------------------------------------------


def _workers_obs(ts: float, workers: list[tuple[int, int, float]]) -> dict[str, Any]:
    """An observation: node n0's training processes (rank, pid, age) under job j."""
    return {"ts": ts, "job": "j", "nodes": {"n0": {"proc_ranks": workers}}, "jobs": {}}


CORDON = Cordon(T + 30, "n0", "engine", "incident 3: node_down")


def test_a_cordon_whose_node_keeps_the_same_stepping_workers_is_a_false_state() -> None:
    # rank 2 (pid 100, 50 s old at T) lives on and steps for a minute after the cordon
    obs = [_workers_obs(T + t, [(2, 100, 50.0 + t)]) for t in range(0, 92, 2)]
    out = cordoned_while_stepping([CORDON], _steps("n0", 2, T, T + 90), obs)
    assert out["judged"] == 1 and out["count"] == 1
    (row,) = out["list"]
    assert row["same_processes"] == [(2, 100)] and row["steps_after_grace"] > 0


def test_a_cordon_after_which_the_restart_replaced_the_workers_is_no_false_state() -> None:
    # the exclusion's launcher restart ended pid 100 at T + 40; pid 200 steps from T + 50
    obs = [_workers_obs(T + t, [(2, 100, 50.0 + t)]) for t in range(0, 40, 2)]
    obs += [_workers_obs(T + t, [(2, 200, t - 42.0)]) for t in range(42, 92, 2)]
    steps = _steps("n0", 2, T, T + 38) + _steps("n0", 2, T + 50, T + 90)
    out = cordoned_while_stepping([CORDON], steps, obs)
    assert out["judged"] == 1 and out["count"] == 0
    # the same process, alive but making no step (a hang), is no false state either
    alive = [_workers_obs(T + t, [(2, 100, 50.0 + t)]) for t in range(0, 92, 2)]
    assert cordoned_while_stepping([CORDON], _steps("n0", 2, T, T + 30), alive)["count"] == 0


def test_a_pid_reused_by_another_process_is_not_the_same_worker() -> None:
    # pid 100 again after the cordon, but 1 s old: another process
    obs = [_workers_obs(T + t, [(2, 100, 50.0 + t)]) for t in range(0, 40, 2)]
    obs += [_workers_obs(T + t, [(2, 100, t - 60.0)]) for t in range(62, 92, 2)]
    obs += [_workers_obs(T + t, [(2, 100, 1.0)]) for t in range(40, 62, 2)]
    out = cordoned_while_stepping([CORDON], _steps("n0", 2, T, T + 90), obs)
    assert out["count"] == 0


# --- 2. a job state its launchers contradict -------------------------------------------


def _job_obs(ts: float, state: str, **j: Any) -> dict[str, Any]:
    row = {
        "api_state": state,
        "api_ended_at": None,
        "ended": False,
        "ended_at": None,
        "end": None,
        "launchers_alive": 2,
        "exit_ok": False,
    }
    return {"ts": ts, "job": "j", "nodes": {}, "jobs": {"j": {**row, **j}}}


def _exited(end: str, at: float, ok: bool) -> dict[str, Any]:
    return {"ended": True, "ended_at": at, "end": end, "launchers_alive": 0, "exit_ok": ok}


def test_a_job_the_api_ended_while_its_launchers_train_is_a_false_state() -> None:
    obs = [_job_obs(T + t, "failed", api_ended_at=T) for t in range(0, 62, 2)]
    out = job_state_vs_launcher(obs, _steps("n0", 0, T, T + 62), relaunch_wait_s=120)
    assert out["count"] == 1 and out["by_kind"] == {"ended_while_training": 1}
    # running, as it is: nothing
    fine = [_job_obs(T + t, "running") for t in range(0, 62, 2)]
    assert job_state_vs_launcher(fine, _steps("n0", 0, T, T + 62), 120)["count"] == 0


def test_stopped_without_an_end_while_training_is_given_up_not_a_false_state() -> None:
    obs = [_job_obs(T + t, "stopped") for t in range(0, 62, 2)]
    out = job_state_vs_launcher(obs, _steps("n0", 0, T, T + 62), 120)
    assert out["count"] == 0 and len(out["given_up"]) == 1
    # stopped and ended (a user's SIGTERM would read so) while it trains: false
    ended = [_job_obs(T + t, "stopped", api_ended_at=T) for t in range(0, 62, 2)]
    assert job_state_vs_launcher(ended, _steps("n0", 0, T, T + 62), 120)["count"] == 1


def test_running_long_after_the_launchers_exited_is_a_false_state() -> None:
    # every launcher exited 0 at T: the backend knows at once; running 60 s later is false
    clean = [_job_obs(T + t, "running", **_exited("exited", T, True)) for t in range(0, 62, 2)]
    out = job_state_vs_launcher(clean, [], relaunch_wait_s=120)
    assert out["by_kind"] == {"active_after_exit": 1}
    # the user's SIGTERM at T: known at once (the backend's contract), so 60 s is false
    sig = [_job_obs(T + t, "running", **_exited("user SIGTERM", T, False)) for t in range(0, 62, 2)]
    assert job_state_vs_launcher(sig, [], 120)["count"] == 1
    # a launcher that failed: the backend waits relaunch_wait_s for a new generation, then
    # calls it failed (T + 130): no false state
    gone = _exited("exited", T, False)
    failed = [_job_obs(T + t, "running", **gone) for t in range(0, 130, 2)]
    failed += [_job_obs(T + t, "failed", api_ended_at=T, **gone) for t in range(130, 200, 2)]
    assert job_state_vs_launcher(failed, [], 120)["count"] == 0
    # still running 180 s after it failed: false
    late = [_job_obs(T + t, "running", **_exited("exited", T, False)) for t in range(0, 200, 2)]
    assert job_state_vs_launcher(late, [], 120)["by_kind"] == {"active_after_exit": 1}


def test_an_end_the_backend_could_not_see_gets_the_wait_for_a_new_generation() -> None:
    # launchers exited 0 at T while an agent was down until T + 40: its ranks' exits were
    # lost, so the backend learns of the end only as a launcher that gave up would show it
    lost = {**_exited("exited", T, True), "end_seen_at": None}
    down = [_job_obs(T + t, "running", **lost) for t in range(0, 40, 2)]
    back = {**lost, "end_seen_at": T + 40}
    later = [_job_obs(T + t, "running", **back) for t in range(40, 200, 2)]
    assert job_state_vs_launcher(down + later[:60], [], 120)["count"] == 0  # to T + 158
    assert job_state_vs_launcher(down + later, [], 120)["by_kind"] == {"active_after_exit": 1}
    # after stop_job (the API said stopped while the launchers ran) the end is known at once
    gave_up = [_job_obs(T + t, "stopped") for t in range(-10, 0, 2)]
    ended = [_job_obs(T + t, "stopped", **_exited("exited", T, False)) for t in range(0, 62, 2)]
    assert job_state_vs_launcher(gave_up + ended, [], 120)["by_kind"] == {"active_after_exit": 1}
    assert job_state_vs_launcher(ended, [], 120)["count"] == 0  # a launcher that gave up


def test_the_wrong_end_is_a_false_state() -> None:
    obs = [
        _job_obs(T + t, "failed", api_ended_at=T, **_exited("exited", T, True))
        for t in range(0, 62, 2)
    ]
    assert job_state_vs_launcher(obs, [], 120)["by_kind"] == {"wrong_end": 1}
    fine = [
        _job_obs(T + t, "finished", api_ended_at=T, **_exited("exited", T, True))
        for t in range(0, 62, 2)
    ]
    assert job_state_vs_launcher(fine, [], 120)["count"] == 0


# --- 3. an incident left open for a job that ended -------------------------------------


def test_an_incident_left_open_for_an_ended_job_is_a_false_state() -> None:
    runs = [
        {"job": "j1", "ended_at": T + 10, "end": "exited"},
        {"job": "j2", "ended_at": T + 600, "end": "stopped by the bench"},  # at the stop
    ]
    incidents = [
        {"id": 1, "job": "j1", "status": "open", "cause": "rank_exit"},
        {"id": 2, "job": "j1", "status": "resolved", "cause": "exception"},
        {"id": 3, "job": "j2", "status": "open", "cause": "hang"},  # not judged
    ]
    out = open_after_end(runs, incidents, stop=T + 599, read_at=T + 620, grace_s=150)
    assert out["jobs_judged"] == 1 and out["count"] == 1
    assert out["list"][0]["incident"] == 1
    pending = [{**incidents[0], "status": "pending"}]
    assert open_after_end(runs, pending, T + 599, T + 620, 150)["count"] == 1
    closed = [{**incidents[0], "status": "failed"}, incidents[1]]
    assert open_after_end(runs, closed, T + 599, T + 620, 150)["count"] == 0
    # A held exclusion the engine turned into a question about the node only: apart.
    node_only = [{**incidents[0], "status": "pending", "decisions": [{"mode": "node_only"}]}]
    out = open_after_end(runs, node_only, T + 599, T + 620, 150)
    assert out["count"] == 0 and [x["incident"] for x in out["node_questions"]] == [1]


# --- 4. goodput that moves after the job's end -----------------------------------------


def _read(at: float, goodput: float, elapsed: float) -> dict[str, Any]:
    return {
        "at": at,
        "goodput": goodput,
        "elapsed_s": elapsed,
        "productive_s": goodput * elapsed,
        "until": T + elapsed,
        "api_ended_at": T + 100,
    }


def test_goodput_that_moves_after_the_end_is_a_false_state() -> None:
    moved = {"job": "j", "ended_at": T + 100, "goodput_reads": [_read(T + 130, 0.8, 100.0)]}
    moved["goodput_reads"].append(_read(T + 140, 0.72, 110.0))
    out = goodput_after_end([moved], stop=T + 600)
    assert out["count"] == 1 and out["jobs_judged"] == 1
    assert set(out["list"][0]["moved"]) == {"goodput", "elapsed_s", "productive_s", "until"}
    still = {**moved, "goodput_reads": [_read(T + 130, 0.8, 100.0), _read(T + 140, 0.8, 100.0)]}
    assert goodput_after_end([still], stop=T + 600)["count"] == 0
    once = {**moved, "goodput_reads": [_read(T + 130, 0.8, 100.0)]}
    out = goodput_after_end([once], stop=T + 600)
    assert out["count"] == 0 and out["unread"] == ["j"] and out["jobs_judged"] == 0


# --- the operator's restarts against the launcher's budget -----------------------------


def _post(code: int, left: int, **kw: Any) -> dict[str, Any]:
    budget = {"restarts_left": left, "workers": 4, "youngest_s": kw.pop("age", 60.0)}
    return {
        "job": "j",
        "at": T,
        "force": kw.pop("force", False),
        "code": code,
        "body_code": "restart_budget" if code == 409 else None,
        "api_restarts_left": left,
        "proc_before": budget,
        "proc_after": kw.pop("after", budget),
        "detail": "",
    }


def test_a_budget_answer_the_workers_contradict_is_wrong() -> None:
    out = budget_answers([_post(409, 3), _post(202, 1)], startup_s=30)
    assert out["judged"] == 2 and out["wrong"] == 2
    assert [x["wrong"] for x in out["wrong_list"]] == [
        "refused with restarts to spare",
        "used the last one",
    ]
    right = budget_answers([_post(409, 1), _post(202, 2), _post(409, 0)], startup_s=30)
    assert right["judged"] == 3 and right["wrong"] == 0
    assert right["answers"] == {"refused for the budget": 2, "accepted": 1}
    # not judged: forced, workers still starting, the budget changed during the post
    changed = {"restarts_left": 1, "workers": 4, "youngest_s": 60.0}
    unjudged = [_post(202, 1, force=True), _post(409, 3, age=5.0), _post(409, 3, after=changed)]
    assert budget_answers(unjudged, startup_s=30)["judged"] == 0


# --- an agent's graceful stop, the user's SIGTERM --------------------------------------


def _node_obs(ts: float, alive: bool, since: float, status: str, down: str | None) -> dict:
    node = {
        "agent_alive": alive,
        "agent_since": since,
        "agent_down": down,
        "api_status": status,
        "api_last_seen": since,
        "proc_ranks": [],
        "api_ranks": [],
    }
    return {"ts": ts, "nodes": {"n0": node}, "jobs": {}}


def test_a_gracefully_stopped_agent_must_read_agent_down_and_come_back() -> None:
    # stopped at T; the API says down (not agent_down) from T + 16
    down = [_node_obs(T + t, False, T, "down", "agent_stop") for t in range(16, 60, 2)]
    assert state_disagreements(down, 15)["by_kind"] == {"agent_stop_not_agent_down": 1}
    ok = [_node_obs(T + t, False, T, "agent_down", "agent_stop") for t in range(16, 60, 2)]
    assert state_disagreements(ok, 15)["episodes"] == []
    # a killed agent's node reading down is right
    killed = [_node_obs(T + t, False, T, "down", "agent_death") for t in range(16, 60, 2)]
    assert state_disagreements(killed, 15)["episodes"] == []
    # started again at T + 60, still agent_down 20 s later: it did not come back
    stuck = [_node_obs(T + t, True, T + 60, "agent_down", None) for t in range(60, 90, 2)]
    assert state_disagreements(stuck, 15)["by_kind"] == {"node_down_agent_alive": 1}


def _report(faults: list[Fault], incidents: list[dict], cordons: list[Cordon]) -> dict:
    return build_report(
        faults=faults,
        incidents=incidents,
        steps=[],
        commands=[],
        cordons=cordons,
        node_events=[],
        observations=[],
        start=T,
        stop=T + 300,
    )


def test_an_incident_for_the_users_sigterm_or_a_graceful_stop_is_undue() -> None:
    sigterm = Fault("user_sigterm", T + 10, "j", None)
    inc = {
        "id": 1,
        "job": "j",
        "status": "resolved",
        "cause": "rank_exit",
        "created_at": T + 11,
        "timeline": {"fault_at": T + 11},
        "evidence": [],
    }
    acc = _report([sigterm], [inc], [])["faults"]["accounted"]
    assert acc["with_an_undue_incident"] == 1 and acc["with_incident"] == 0
    acc = _report([sigterm], [], [])["faults"]["accounted"]
    assert acc["with_an_undue_incident"] == 0 and acc["needing_no_incident"] == 1


def test_a_cordon_for_a_graceful_stop_is_wrongful_and_one_for_a_killed_agent_is_not() -> None:
    cordon = Cordon(T + 50, "n0", "engine", "incident 1: node_down")
    stop = Fault("agent_stop", T + 20, "j", "n0", down_s=60.0)
    assert _report([stop], [], [cordon])["wrongful"]["cordons"]["wrongful"] == 1
    kill = Fault("agent_death", T + 20, "j", "n0", down_s=60.0)
    assert _report([kill], [], [cordon])["wrongful"]["cordons"]["wrongful"] == 0
