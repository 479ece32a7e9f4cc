"""The engine's decisions and an operator's restart take one path, incidents.service:
their commands come from one function, and each change of an incident reaches the live
bus once, after its commit (the engine's transactions, the operator's routes and the
agents' acks alike)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import wait_for
from trainguard.backend.incidents import service as incidents_service

DRY_RUN = 'mode = "dry_run"\n[limits]\ncooldown_s = 0\n'


class Live:
    """A browser's subscription to the app's live bus (topics `incidents` and `events`)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.bus = client.app.state.bus
        self.sub = self.bus.subscribe(frozenset({"incidents", "events"}))
        self.marks = 0
        self.got: list[tuple[str, Any]] = []

    def take(self) -> list[tuple[str, Any]]:
        """The incident and command messages published since the last take, in order. A
        mark published now arrives after all of them (the bus keeps the order), so what
        came before it is all there is."""
        self.marks += 1
        mark = ("mark", self.marks)
        self.bus.publish("incidents", "mark", self.marks)

        def drain() -> bool:
            while not self.sub.queue.empty():
                self.got.append(self.sub.queue.get_nowait())
            return mark in self.got

        wait_for(lambda: self.client.portal.call(drain), 10, 0.01)
        cut = self.got.index(mark)
        taken, self.got = self.got[:cut], self.got[cut + 1 :]
        return [(name, data) for name, data in taken if name in ("incident", "command")]


def incidents_in(messages: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    return [data for name, data in messages if name == "incident"]


def test_an_engine_decision_and_a_manual_restart_make_commands_through_one_function(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[tuple[str, str, dict[int, list[int]], bool]] = []
    issue = incidents_service.issue_commands

    def recording(*args: Any, **kw: Any) -> int:
        _session, inc, action, targets, *_ = args
        made.append((inc.trigger, action, dict(targets), kw["fault"]))
        return issue(*args, **kw)

    monkeypatch.setattr(incidents_service, "issue_commands", recording)
    c = make_cluster()
    c.job("auto-job", {"n1": (0, 1), "n2": (2, 3)})
    c.job("manual-job", {"n3": (0, 1)})
    c.event("n1", "exception", job="auto-job", rank=1, message="boom")
    c.decide()
    r = c.client.post(
        "/api/v1/jobs/manual-job/restarts", json={"level": "launcher", "reason": "drain n3"}
    )
    assert r.status_code == 202, r.text
    nodes = {n: c.commands(n) for n in ("n1", "n2", "n3")}
    assert [(trigger, action, len(targets), fault) for trigger, action, targets, fault in made] == [
        ("auto", "in_process", 2, True),
        ("manual", "launcher", 1, False),
    ]
    # Every command the agents get is one of those: there is no other way to make one.
    assert len(c.all_commands()) == sum(len(t) for _, _, t, _ in made) == 3
    assert [(x["job"], x["params"]["ranks"]) for x in nodes["n3"]] == [("manual-job", "0,1")]
    assert "attempt" not in nodes["n3"][0]["params"]  # a manual restart has no earlier fault
    assert {x["params"]["ranks"] for x in nodes["n1"] + nodes["n2"]} == {"0,1", "2,3"}


def test_each_change_of_an_incident_is_published_once(make_cluster: Any) -> None:
    c = make_cluster()
    live = Live(c.client)
    c.job("job", {"n1": (0, 1)})
    c.job("manual-job", {"n2": (0,)})
    live.take()

    c.event("n1", "exception", job="job", rank=0, message="boom")
    c.decide()
    (opened,) = incidents_in(live.take())  # one transaction: opened, decided, acted on
    assert (opened["status"], opened["level"], len(opened["commands"])) == ("open", "in_process", 1)
    c.decide()
    assert live.take() == []  # a cycle that changes nothing publishes nothing

    cid = opened["commands"][0]["id"]
    for phase in ("delivered", "torn_down", "restarted", "resumed"):
        c.ack(cid, "n1", phase)
        messages = live.take()
        # The command's phase (the incident page follows its commands), then the change.
        assert [name for name, _ in messages] == ["command", "incident"], messages
        assert messages[0][1] == {"command_id": cid, "phase": phase, "node": "n1"}
        assert messages[1][1]["timeline"][f"{phase}_at"] is not None
    assert messages[1][1]["status"] == "resolved"
    c.ack(cid, "n1", "resumed")  # a replayed ack changes nothing
    assert [name for name, _ in live.take()] == ["command"]

    r = c.client.post("/api/v1/jobs/manual-job/restarts", json={"level": "launcher", "reason": "x"})
    assert r.status_code == 202, r.text
    (manual,) = incidents_in(live.take())
    assert manual == r.json()  # published as the route answered it, after its commit


def test_a_recommendation_its_approval_and_the_action_are_published_once_each(
    make_cluster: Any,
) -> None:
    c = make_cluster(DRY_RUN)
    live = Live(c.client)
    c.job("job", {"n1": (0, 1)})
    c.job("other-job", {"n2": (0,)})
    c.event("n1", "exception", job="job", rank=0, message="boom")
    c.decide()
    (pending,) = incidents_in(live.take())
    assert pending["status"] == "pending" and pending["commands"] == []

    r = c.client.post(f"/api/v1/incidents/{pending['id']}/approve", json={"reason": "ok"})
    assert r.status_code == 202, r.text
    (approved,) = incidents_in(live.take())
    assert approved["status"] == "open" and approved["outcome"].startswith("approved by")
    c.decide()
    (acted,) = incidents_in(live.take())
    assert len(acted["commands"]) == 1 and acted["decisions"][-1]["mode"] == "approved"

    c.event("n2", "exception", job="other-job", rank=0, message="boom")
    c.decide()
    (second,) = incidents_in(live.take())
    assert second["status"] == "pending" and second["job"] == "other-job"
    r = c.client.post(f"/api/v1/incidents/{second['id']}/reject", json={"reason": "no"})
    assert r.status_code == 200, r.text
    (rejected,) = incidents_in(live.take())
    assert rejected["status"] == "rejected" and rejected == r.json()
