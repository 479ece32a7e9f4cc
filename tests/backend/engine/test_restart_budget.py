"""The launcher's restart budget (--max-restarts, shared by faults and operator restarts):
shown on GET /jobs/{job}, respected by manual restarts (409 without force when a launcher
restart would use the last one) and by the engine (in_process, or a hold for an
operator, with one launcher restart left). Both databases, the engine's test clock."""

from __future__ import annotations

from typing import Any

from trainguard.protocol import wire


def _declare(
    c: Any,
    node: str,
    ranks: tuple[int, ...],
    max_restarts: int | None,
    restart_count: int | None,
    in_process: bool = False,
    launcher: str = "torchrun",
    world: int = 2,
) -> None:
    c.post(
        node,
        ranks=[
            wire.RankStatus(
                job="job",
                rank=r,
                pid=1000 + r,
                world_size=world,
                attempt=restart_count or 0,
                in_process=in_process,
                launcher=launcher,  # type: ignore[arg-type]  # a Launcher literal
                max_restarts=max_restarts,
                restart_count=restart_count,
            )
            for r in ranks
        ],
    )


def _job(c: Any, used: int | None, in_process: bool = False, most: int | None = 3) -> None:
    c.job("job", {"n1": (0, 1)})
    _declare(c, "n1", (0, 1), most, used, in_process, "ft_launcher" if in_process else "torchrun")


def test_the_job_shows_its_launchers_restarts_left(make_cluster: Any) -> None:
    c = make_cluster()
    c.job("job", {"n1": (0, 1)})
    j = c.client.get("/api/v1/jobs/job").json()
    assert (j["max_restarts"], j["restart_count"], j["restarts_left"]) == (None, None, None)
    _declare(c, "n1", (0, 1), 3, 2)
    j = c.client.get("/api/v1/jobs/job").json()
    assert (j["max_restarts"], j["restart_count"], j["restarts_left"]) == (3, 2, 1)
    assert {(r["max_restarts"], r["restart_count"]) for r in j["ranks"]} == {(3, 2)}


def test_several_launchers_the_tightest_one_counts(make_cluster: Any) -> None:
    # Two torchruns count their own restarts (a healthy node's agent does not count the
    # other's failure): the job has what its tightest launcher has left.
    c = make_cluster()
    c.job("job", {"n1": (0,), "n2": (1,)})
    _declare(c, "n1", (0,), 3, 1)
    _declare(c, "n2", (1,), 3, 3)
    j = c.client.get("/api/v1/jobs/job").json()
    assert (j["max_restarts"], j["restart_count"], j["restarts_left"]) == (3, 3, 0)


def test_a_launcher_restart_that_would_use_the_last_one_needs_force(make_cluster: Any) -> None:
    c = make_cluster()
    _job(c, used=2)
    body = {"level": "launcher", "reason": "stuck data loader"}
    r = c.client.post("/api/v1/jobs/job/restarts", json=body)
    assert r.status_code == 409, r.text
    out = r.json()
    assert out["code"] == "restart_budget"
    detail = out["detail"]
    for words in ("allows 3 restarts", "has used 2", "the last one", "--max-restarts", "force"):
        assert words in detail, detail
    assert c.incidents("job") == []  # nothing changed
    r = c.client.post("/api/v1/jobs/job/restarts", json={**body, "force": True})
    assert r.status_code == 202, r.text
    inc = r.json()
    assert inc["level"] == "launcher" and inc["trigger"] == "manual"
    assert "forced" in inc["decisions"][-1]["why"] and inc["commands"]


def test_with_none_left_the_refusal_says_the_restart_ends_the_job(make_cluster: Any) -> None:
    c = make_cluster()
    _job(c, used=3)
    r = c.client.post("/api/v1/jobs/job/restarts", json={"level": "launcher", "reason": "x"})
    assert r.status_code == 409 and "none is left" in r.json()["detail"], r.text


def test_a_launcher_restart_with_restarts_to_spare_or_an_unknown_budget_goes(
    make_cluster: Any,
) -> None:
    c = make_cluster("[limits]\ncooldown_s = 0\n")
    _job(c, used=1)  # 2 left
    r = c.client.post("/api/v1/jobs/job/restarts", json={"level": "launcher", "reason": "x"})
    assert r.status_code == 202, r.text
    c.recover()
    _declare(c, "n1", (0, 1), None, None)  # an older SDK: nothing is known, nothing refused
    r = c.client.post("/api/v1/jobs/job/restarts", json={"level": "launcher", "reason": "y"})
    assert r.status_code == 202, r.text


def test_an_in_process_restart_does_not_use_the_launchers_budget(make_cluster: Any) -> None:
    c = make_cluster()
    _job(c, used=3, in_process=True)
    r = c.client.post("/api/v1/jobs/job/restarts", json={"level": "in_process", "reason": "x"})
    assert r.status_code == 202, r.text
    assert r.json()["level"] == "in_process"


def test_with_one_launcher_restart_left_a_rank_exit_gets_in_process(make_cluster: Any) -> None:
    c = make_cluster()
    _job(c, used=2, in_process=True)
    c.event("n1", "rank_exit", job="job", rank=1, data={"signal": 9})
    c.decide()
    (inc,) = c.incidents("job")
    assert (inc["cause"], inc["level"], inc["status"]) == ("rank_exit", "in_process", "open")
    why = inc["decisions"][-1]["why"]
    assert "the last one" in why and "in_process instead" in why, why
    assert {x["action"] for x in inc["commands"]} == {"in_process"}


def test_with_one_launcher_restart_left_a_job_without_the_wrapper_waits_for_an_operator(
    make_cluster: Any,
) -> None:
    c = make_cluster()
    _job(c, used=2)
    c.event("n1", "rank_exit", job="job", rank=1, data={"signal": 9})
    c.decide()
    (inc,) = c.incidents("job")
    assert (inc["level"], inc["status"]) == ("launcher", "pending")
    assert inc["commands"] == [] and inc["decisions"][-1]["mode"] == "budget"
    assert "allows 3 restarts" in inc["outcome"] and "--max-restarts" in inc["outcome"]
    # An operator approves: the launcher restart is carried out, using the last one.
    r = c.client.post(f"/api/v1/incidents/{inc['id']}/approve", json={"reason": "last one"})
    assert r.status_code == 202, r.text
    c.clock.advance(5)
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["status"] == "open" and {x["action"] for x in inc["commands"]} == {"launcher"}


def test_with_restarts_to_spare_a_rank_exit_gets_a_launcher_restart(make_cluster: Any) -> None:
    c = make_cluster()
    _job(c, used=1, in_process=True)
    c.event("n1", "rank_exit", job="job", rank=1, data={"signal": 9})
    c.decide()
    (inc,) = c.incidents("job")
    assert (inc["level"], inc["status"]) == ("launcher", "open")


def test_a_held_restart_the_launcher_did_by_itself_resolves(make_cluster: Any) -> None:
    # Plain torchrun restarts its workers after a rank death by itself (with its last
    # restart): the held incident must not wait for an operator any more.
    c = make_cluster()
    _job(c, used=2)
    c.event("n1", "rank_exit", job="job", rank=1, data={"signal": 9})
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["status"] == "pending"
    c.clock.advance(5)
    c.post(
        "n1",
        steps=[
            wire.StepReport(
                job="job", rank=r, step=11, start=c.clock.t - 1, end=c.clock.t, attempt=3
            )
            for r in (0, 1)
        ],
    )
    c.clock.advance(1)
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["status"] == "resolved" and inc["commands"] == [], inc
    assert "recovered by itself" in inc["outcome"]
