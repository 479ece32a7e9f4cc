"""The job's shape on `GET /jobs/{job}` and the spare capacity on `GET /jobs` (docs/engine.md,
"The job's shape"), from what agents post through the real ingest, on both databases:
active nodes, hot spares (counted only while their agent reports and their node is not
cordoned), nodes an exclusion of the job took out, and --nnodes MIN:MAX."""

from __future__ import annotations

from typing import Any

from trainguard.protocol import wire


def launcher(pid: int, state: str, nodes: tuple[int, int] = (2, 2)) -> wire.LauncherStatus:
    return wire.LauncherStatus(
        job="job", pid=pid, state=state, launcher="torchrun", min_nodes=nodes[0],
        max_nodes=nodes[1], ranks=2 if state == "active" else 0,
    )  # fmt: skip


def shape(c: Any) -> dict[str, Any]:
    return c.client.get("/api/v1/jobs/job").json()["shape"]


def listed(c: Any) -> int:
    (job,) = [j for j in c.client.get("/api/v1/jobs").json() if j["name"] == "job"]
    return int(job["spare_capacity"])


def test_two_nodes_train_a_third_waits_and_an_exclusion_takes_one_out(
    make_cluster: Any,  # the fixture imported above
) -> None:
    c = make_cluster(fresh=15.0)
    c.job("job", {"n0": (0, 1), "n1": (2, 3)})
    c.post("n0", launchers=[launcher(100, "active")])
    c.post("n1", launchers=[launcher(200, "active")])
    c.post("n2", launchers=[launcher(300, "spare")])
    s = shape(c)
    assert s["active"] == ["n0", "n1"]
    assert [(x["node"], x["pid"], x["available"], x["why"]) for x in s["spares"]] == [
        ("n2", 300, True, None)
    ]
    assert (s["spare_capacity"], s["excluded"], s["min_nodes"], s["max_nodes"]) == (1, [], 2, 2)
    assert s["elastic"] is False and s["reported"] is True
    assert listed(c) == 1
    # XID 79 on n1: the engine excludes it (cordon, with this job's incident).
    c.event("n1", "xid", xid=79, gpu_uuid="GPU-n1-0")
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["level"] == "exclude_node"
    s = shape(c)
    assert [(x["node"], x["incident_id"]) for x in s["excluded"]] == [("n1", inc["id"])]
    # n1's launcher ended, the spare joined: n0 and n2 train.
    c.post("n1", launchers=[])
    c.exited("n1", "job", (2, 3), code=-9)
    c.post("n2", launchers=[launcher(300, "active")])
    c.job("job", {"n2": (2, 3)}, step=11)
    s = shape(c)
    assert (s["active"], s["spares"], s["spare_capacity"]) == (["n0", "n2"], [], 0)
    assert [x["node"] for x in s["excluded"]] == ["n1"]
    assert listed(c) == 0


def test_a_spare_whose_agent_is_down_or_whose_node_is_cordoned_is_no_capacity(
    make_cluster: Any,
) -> None:
    c = make_cluster(fresh=15.0)
    c.job("job", {"n0": (0, 1)})
    c.post("n0", launchers=[launcher(100, "active", (1, 3))])
    c.post("n1", launchers=[launcher(200, "spare", (1, 3))])
    c.post("n2", launchers=[launcher(300, "spare", (1, 3))])
    s = shape(c)
    assert (s["spare_capacity"], s["min_nodes"], s["max_nodes"], s["elastic"]) == (2, 1, 3, True)
    c.heard("n1", c.clock.t - 3600)  # n1's agent went silent an hour ago
    r = c.client.post("/api/v1/nodes/n2/cordon", json={"reason": "bad HBM"})
    assert r.status_code == 200, r.text
    s = shape(c)
    assert [(x["node"], x["available"], x["why"]) for x in s["spares"]] == [
        ("n1", False, "agent down: no report since the freshness window"),
        ("n2", False, "node cordoned"),
    ]
    assert s["spare_capacity"] == 0 and s["excluded"] == []  # an operator's cordon, no incident
    assert listed(c) == 0
    # A batch without a list (an older agent's, or nothing changed) keeps the last one.
    c.post("n1")
    assert [x["available"] for x in shape(c)["spares"]] == [True, False]
    assert listed(c) == 1


def test_a_job_without_launcher_lists_has_no_spares_and_says_so(
    make_cluster: Any,
) -> None:
    c = make_cluster(fresh=15.0)
    c.job("job", {"n0": (0,), "n1": (1,)})
    s = shape(c)
    assert (s["active"], s["spares"], s["reported"], s["min_nodes"]) == (
        ["n0", "n1"], [], False, None,
    )  # fmt: skip


def test_a_bad_launcher_list_is_refused_with_the_field_named(make_cluster: Any) -> None:
    c = make_cluster()
    body = {"node": "n0", "agent_id": "agent-n0", "seq": 1, "sent_at": 1.0e9}
    one = {"job": "job", "pid": 1, "state": "dozing", "launcher": "torchrun"}
    r = c.client.post("/api/v1/ingest", json={**body, "launchers": [one]})
    assert r.status_code == 422, r.text
    assert "launchers[0].state" in r.json()["detail"]
    one = {**one, "state": "spare", "max_nodes": 0}
    r = c.client.post("/api/v1/ingest", json={**body, "seq": 2, "launchers": [one]})
    assert r.status_code == 422 and "max_nodes" in r.json()["detail"], r.text
