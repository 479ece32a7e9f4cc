"""Checkpoint-interval advice: Daly's reference values, the waste model, the what-if
calculator, and a job's measured MTBF, checkpoint cost and restart time."""

from __future__ import annotations

from typing import Any

import pytest

from tests.backend.analytics.scenario import T0
from tests.backend.analytics.test_goodput import _ingest_scenario, _post
from trainguard.backend.analytics import advice
from trainguard.protocol import wire

MIN = 60.0
HOUR = 3600.0


@pytest.mark.parametrize(("mtbf_s", "minutes"), [(24 * HOUR, 117), (6 * HOUR, 57), (15 * MIN, 9.1)])
def test_daly_reproduces_the_reference_values(mtbf_s: float, minutes: float) -> None:
    # anchors.md: d = 5 min; M = 24 h -> 117 min, 6 h -> 57 min, 15 min -> 9.1 min.
    got = advice.daly(5 * MIN, mtbf_s) / MIN
    assert round(got, 0 if minutes > 10 else 1) == minutes


def test_young_and_the_degenerate_daly_case() -> None:
    assert advice.young(5 * MIN, 24 * HOUR) == pytest.approx(120 * MIN)
    assert advice.daly(10 * MIN, 4 * MIN) == 4 * MIN  # d >= 2M: checkpoint every M


def test_waste_model_is_smallest_near_the_optimum() -> None:
    c, r, m = 30.0, 60.0, 3 * HOUR
    t = advice.daly(c, m)
    assert advice.waste_fraction(t, c, r, m) == pytest.approx(c / t + (t / 2 + r) / m)
    for other in (t / 3, t * 3):
        assert advice.efficiency(other, c, r, m) < advice.efficiency(t, c, r, m)


def test_recommend_without_failures_or_cost_says_nothing() -> None:
    rec = advice.recommend(None, 3600.0, 10.0, 600.0)
    assert rec["daly_interval_s"] is None and rec["expected_efficiency_current"] is None


def test_whatif_for_llama3_scale(client: Any) -> None:
    body = {
        "gpus": 16384,
        "checkpoint_cost_s": 30,
        "restart_s": {"in_process": 10, "launcher": 300},
        "level_mix": {"in_process": 3, "launcher": 1},
    }
    r = client.post("/api/v1/advice/whatif", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    # Llama 3's rate: one interruption per ~3.1 h for the 16,384-GPU job.
    assert out["job_mtbf_s"] / HOUR == pytest.approx(54 * 24 / 419)
    assert out["failures_per_day"] == pytest.approx(419 / 54)
    assert out["interval_s"] == pytest.approx(advice.daly(30, out["job_mtbf_s"]))
    levels = {row["level"]: row for row in out["levels"]}
    m, t = out["job_mtbf_s"], out["interval_s"]
    assert levels["launcher"]["expected_goodput"] == pytest.approx(1 - (30 / t + (t / 2 + 300) / m))
    assert levels["in_process"]["expected_goodput"] > levels["launcher"]["expected_goodput"]
    assert out["mix"]["restart_s"] == pytest.approx(0.75 * 10 + 0.25 * 300)
    assert out["mix"]["lost_minutes_per_day"] == pytest.approx(
        (1 - out["mix"]["expected_goodput"]) * 1440
    )
    # A fixed interval is evaluated as given.
    fixed = client.post("/api/v1/advice/whatif", json={**body, "checkpoint_interval_s": 3600})
    assert fixed.json()["interval_s"] == 3600


@pytest.mark.parametrize(
    "bad",
    [
        {"gpus": 0, "checkpoint_cost_s": 30, "restart_s": {"launcher": 300}},
        {"gpus": 8, "checkpoint_cost_s": 30, "restart_s": {}},
        {"gpus": 8, "checkpoint_cost_s": 30, "restart_s": {"reboot": 3}},
        {
            "gpus": 8,
            "checkpoint_cost_s": 30,
            "restart_s": {"launcher": 300},
            "level_mix": {"in_process": 1},
        },
    ],
)
def test_whatif_refuses_bad_input(client: Any, bad: dict[str, Any]) -> None:
    r = client.post("/api/v1/advice/whatif", json=bad)
    assert r.status_code == 422, r.text


def test_job_advice_measures_mtbf_checkpoint_cost_and_restart_time(
    make_client: Any, db_url: str
) -> None:
    # The job is over (idle), so its clock stops at its last step, T0 + 388.
    client = make_client(goodput_idle_after_s=0.001)
    _ingest_scenario(client, db_url)
    fault = wire.Event(kind="rank_exit", ts=T0 + 162.5, job="gp", rank=1, data={"exit_code": 1})
    _post(client, "n1", 99, events=[fault])
    r = client.get("/api/v1/jobs/gp/advice")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["observed_s"] == pytest.approx(388.0)
    assert out["failures"] == 2 and out["failures_without_incident"] == 0
    assert out["mtbf_s"] == pytest.approx(194.0) and out["mtbf_source"] == "measured"
    assert out["nodes"] == [{"node": "n1", "failures": 1, "mtbf_s": pytest.approx(388.0)}]
    ckpt = out["checkpoint"]
    assert ckpt["saves"] == 2 and ckpt["cost_s"] == pytest.approx(2.5)  # 2 s and 3 s
    assert ckpt["interval_s"] == pytest.approx(167.0)  # saves end at T0+112 and T0+279
    assert ckpt["restores"] == 2 and ckpt["restore_s"] == pytest.approx(7.5)
    restart = out["restart"]
    assert restart["median_s"] == pytest.approx((14.5 + 4.7) / 2)
    assert restart["by_level"]["launcher"] == {"count": 1, "median_s": pytest.approx(14.5)}
    rec = out["recommendation"]
    assert rec["daly_interval_s"] == pytest.approx(advice.daly(2.5, 194.0))
    assert rec["young_interval_s"] == pytest.approx(advice.young(2.5, 194.0))
    assert rec["expected_efficiency_current"] == pytest.approx(
        advice.efficiency(167.0, 2.5, 9.6, 194.0)
    )
    assert rec["expected_efficiency_recommended"] > rec["expected_efficiency_current"]
    assert client.get("/api/v1/jobs/nope/advice").status_code == 404
