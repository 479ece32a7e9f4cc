"""Command params typed by action (trainguard.protocol.payloads): what the backend issues
(an automatic action with its fault's generation, an operator's restart without one)
reaches the agent's decoder over the poll route and reads as its action's Struct; a
command whose params break their Struct is acked `failed` with the field's path, and the
commands behind it are still carried out."""

from __future__ import annotations

from typing import Any

import msgspec

from trainguard.agent.executors.loop import decode_commands
from trainguard.protocol import payloads, wire


def test_the_backends_commands_decode_in_the_agent_as_their_actions_params(
    make_cluster: Any,
) -> None:
    c = make_cluster()
    c.job("auto-job", {"n1": (0, 1), "n2": (2, 3)})
    c.job("manual-job", {"n3": (0, 1)})
    c.event("n1", "exception", job="auto-job", rank=1, message="boom")
    c.decide()
    r = c.client.post("/api/v1/jobs/manual-job/restarts", json={"level": "launcher", "reason": "x"})
    assert r.status_code == 202, r.text
    got = {n: decode_commands(msgspec.json.encode(c.commands(n))) for n in ("n1", "n3")}
    (auto,), (manual,) = got["n1"], got["n3"]
    fault = auto.typed_params()
    assert (auto.action, type(fault)) == ("in_process", payloads.CommandParams)
    assert (fault.ranks, fault.cause, fault.attempt, fault.iteration) == ("0,1", "exception", 0, 0)
    assert fault.fault_at is not None
    restart = manual.typed_params()
    assert isinstance(restart, payloads.LauncherParams)
    assert (restart.ranks, restart.attempt, restart.grace_s) == ("0,1", None, None)


def test_a_command_with_a_bad_param_is_acked_failed_naming_it() -> None:
    acks: list[tuple[str, wire.Ack]] = []
    base = {"job": "j", "node": "n1", "issued_at": 1e9}
    body = msgspec.json.encode(
        [
            {**base, "id": "c1", "action": "launcher", "params": {"grace_s": -2.0}},
            {**base, "id": "c2", "action": "stop_job", "params": {"timeout_s": "soon"}},
            {**base, "id": "c3", "action": "in_process", "params": {"ranks": "0;1"}},
            {**base, "id": "c4", "action": "launcher", "params": {"grace_s": 2, "attempt": 0}},
            {**base, "id": "c5", "action": "in_process", "params": {"ranks": [0, 1]}},
            {**base, "id": "c6", "action": "stop_job", "params": {"a_newer_param": "kept"}},
        ]
    )
    ok = decode_commands(body, lambda cid, ack: acks.append((cid, ack)))
    assert [(c.id, c.params) for c in ok] == [
        ("c4", {"grace_s": 2, "attempt": 0}),
        ("c5", {"ranks": "0,1"}),  # a list is joined, as before
        ("c6", {"a_newer_param": "kept"}),
    ]
    assert ok[0].typed_params() == payloads.LauncherParams(grace_s=2.0, attempt=0)
    failed = {cid: (a.phase, a.detail) for cid, a in acks}
    assert set(failed) == {"c1", "c2", "c3"}
    assert all(phase == "failed" for phase, _ in failed.values())
    assert "in launcher params - at `params.grace_s`" in failed["c1"][1]
    assert "in stop_job params - at `params.timeout_s`" in failed["c2"][1]
    assert "at `params.ranks`" in failed["c3"][1]


def test_an_action_without_a_struct_of_its_own_takes_the_common_params() -> None:
    assert set(payloads.COMMAND_PARAMS) <= set(wire.Action.__args__)  # type: ignore[attr-defined]  # a Literal's values
    assert payloads.command_params("in_process", {"ranks": "3"}) == payloads.CommandParams("3")
    leave = payloads.command_params("exclude_node", {"ranks": "3", "grace_s": 5})
    assert leave == payloads.ExcludeNodeParams(ranks="3", grace_s=5.0)
