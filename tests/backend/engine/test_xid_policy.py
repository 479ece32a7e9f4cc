"""The default XID policy, row by row over NVIDIA's catalog (agent/protocol/xid.py XID_CATALOG),
through the real ingest, engine and command channel."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.support import wait_for
from trainguard.protocol import wire
from trainguard.protocol.xid import XID_CATALOG

# What the default policy does with each XID when no GPU reset hook is configured
# (reference/xid-and-nvml.md): application errors restart in-process; a GPU that needs a
# reset is unusable until reset, so without a reset hook its node is excluded; a GPU off
# the bus excludes its node; the IGNORE class is recorded only.
EXPECTED: dict[int, str | None] = {
    13: "in_process",
    31: "in_process",
    32: "in_process",
    38: None,
    43: None,
    45: "in_process",
    46: "exclude_node",
    48: "exclude_node",
    61: "exclude_node",
    62: "exclude_node",
    63: None,
    64: "exclude_node",
    68: "in_process",
    69: "in_process",
    74: "exclude_node",
    79: "exclude_node",
    92: None,
    94: "in_process",
    95: "exclude_node",
    109: "exclude_node",
    119: "exclude_node",
    120: "exclude_node",
    121: None,
    140: "exclude_node",
    143: "exclude_node",
    **{x: "exclude_node" for x in range(144, 151)},
    154: None,
}
RESET_CLASS = sorted(
    c
    for c, info in XID_CATALOG.items()
    if EXPECTED[c] == "exclude_node" and info.action != "RESTART_BM"
)


def test_the_table_covers_the_whole_catalog() -> None:
    assert set(EXPECTED) == set(XID_CATALOG)


def _commands_by_node(cluster: Any, job: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for inc in cluster.incidents(job):
        for c in inc["commands"]:
            out.setdefault(c["node"], []).append(c["action"])
    return out


def test_every_catalog_xid_gets_its_default_action(make_cluster: Any) -> None:
    # Every code in one cluster: the breaker would hold the exclusions past a quarter of it.
    c = make_cluster("[breaker]\nmax_fraction = 1.0\n")
    for code, expected in EXPECTED.items():
        job, bad, good = f"job-{code}", f"x{code}", f"h{code}"
        c.job(job, {bad: (0, 1), good: (2, 3)})
        c.event(bad, "xid", xid=code, gpu_uuid=f"GPU-{bad}-0", data={"source": "injected"})
        c.decide()
        incidents = c.incidents(job)
        if expected is None:
            assert incidents == [], f"xid {code} must be recorded only"
            continue
        assert len(incidents) == 1, code
        inc = incidents[0]
        assert (inc["level"], inc["cause"], inc["xid"], inc["node"]) == (
            expected,
            f"xid {code}",
            code,
            bad,
        ), code
        cmds = _commands_by_node(c, job)
        if expected == "in_process":
            assert cmds == {bad: ["in_process"], good: ["in_process"]}, code
        else:  # the node is cordoned and leaves the job; a launcher restart on the others
            assert cmds == {bad: ["exclude_node"], good: ["launcher"]}, code
            node = c.client.get(f"/api/v1/nodes/{bad}").json()
            assert node["cordoned"] is True, code
    counts = c.engine.status()["counts"]
    assert counts["ignored"] == sum(1 for v in EXPECTED.values() if v is None)


@pytest.mark.parametrize("code", [48, 74, 95])
def test_with_a_reset_hook_the_gpu_is_reset_then_the_job_restarts(
    make_cluster: Any, code: int
) -> None:
    hook = sys.executable + """ -c "print('reset {node} gpu {gpu_index}')" """
    c = make_cluster("[hooks]\ngpu_reset = '''" + hook + "'''\n")
    assert code in RESET_CLASS
    c.post("n1", gpus=[wire.GpuInfo(uuid="GPU-n1-3", index=3, name="sim")])
    c.job("job", {"n1": (0,), "n2": (1,)})
    c.event("n1", "xid", xid=code, gpu_uuid="GPU-n1-3")
    c.decide()
    inc = c.incidents("job")[0]
    assert inc["level"] == "launcher" and inc["commands"] == []  # the hook first

    def restarted() -> Any:
        c.decide()
        return _commands_by_node(c, "job")

    assert wait_for(restarted) == {"n1": ["launcher"], "n2": ["launcher"]}
    inc = c.incidents("job")[0]
    (run,) = inc["hooks"]
    assert run["hook"] == "gpu_reset" and run["ok"] is True and run["rc"] == 0
    assert run["output"].strip() == "reset n1 gpu 3"
    assert c.client.get("/api/v1/nodes/n1").json()["cordoned"] is False


def test_a_failing_reset_hook_excludes_the_node(make_cluster: Any) -> None:
    c = make_cluster(f"[hooks]\ngpu_reset = \"{sys.executable} -c 'raise SystemExit(3)'\"\n")
    c.job("job", {"n1": (0,), "n2": (1,)})
    c.event("n1", "xid", xid=48)

    def excluded() -> Any:
        c.decide()
        inc = c.incidents("job")[0]
        return inc if inc["commands"] else None

    inc = wait_for(excluded)
    assert inc["level"] == "exclude_node" and inc["escalations"] == 1
    assert [h["rc"] for h in inc["hooks"]] == [3]
    assert _commands_by_node(c, "job") == {"n1": ["exclude_node"], "n2": ["launcher"]}


@pytest.mark.parametrize(
    ("code", "recovery", "expected"),
    [
        (13, 2, "exclude_node"),  # NODE_REBOOT beats the application bucket
        (13, "NODE_REBOOT", "exclude_node"),
        (43, 4, "exclude_node"),  # DRAIN_AND_RESET beats IGNORE
        (13, 0, "in_process"),  # NONE: no GPU action, the XID's bucket decides
        (48, 1, "exclude_node"),  # GPU_RESET without a reset hook
    ],
)
def test_nvml_recovery_action_takes_precedence(
    make_cluster: Any, code: int, recovery: Any, expected: str
) -> None:
    c = make_cluster()
    c.job("job", {"n1": (0,), "n2": (1,)})
    c.event("n1", "xid", xid=code, data={"recovery_action": recovery})
    c.decide()
    (inc,) = c.incidents("job")
    assert inc["level"] == expected


def test_repeated_hard_xids_on_one_node_exclude_it(make_cluster: Any) -> None:
    hook = f"{sys.executable} -c pass"
    c = make_cluster(f'[hooks]\ngpu_reset = "{hook}"\n[limits]\ncooldown_s = 0\n')
    c.job("job", {"n1": (0,), "n2": (1,)})
    c.event("n1", "xid", xid=48)

    def acted() -> int:
        c.decide()
        return len(c.all_commands())

    wait_for(acted)  # first one: GPU reset, then a launcher restart
    assert c.incidents("job")[0]["level"] == "launcher"
    c.recover()
    c.clock.advance(120)
    c.job("job", {"n1": (0,), "n2": (1,)})
    c.event("n1", "xid", xid=95)  # a second hard XID within the hour
    c.decide()
    second = c.incidents("job")[-1]
    assert second["level"] == "exclude_node"
    assert "hard XIDs on n1" in second["decisions"][-1]["why"]
    assert _commands_by_node(c, "job")["n2"][-1] == "launcher"
