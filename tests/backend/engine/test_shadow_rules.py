"""Shadow rules (issue #36 item 3): a policy rule written `{action = ..., shadow = true}`
is evaluated live and recorded ("would have done X"), never acted on; the rule in force
(the default's, or the file's own value without the shadow mark) acts. The incident shows
shadow decisions beside its real ones; evidence the policy in force ignores but a shadow
rule would act on is recorded as a `shadow` event. Real ingest and engine, both
databases; bad rule tables refused with the key and the line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.backend.engine.conftest import Cluster
from trainguard.backend.engine.policy import PolicyError, load_policy

SHADOW = """\
[causes]
exception = { action = "launcher", shadow = true }
[xid.codes]
43 = { action = "reset_gpu", shadow = true }
[limits]
cooldown_s = 0
"""


def test_the_rule_in_force_acts_and_the_shadow_rule_is_recorded(make_cluster: Any) -> None:
    c: Cluster = make_cluster(SHADOW)
    c.job("sh", {"n1": (0, 1)})
    c.event("n1", "exception", job="sh", rank=1, message="RuntimeError: boom")
    c.decide()
    (inc,) = c.incidents("sh")
    # The default's exception rule (in_process) acted: the shadow rule did not.
    assert inc["level"] == "in_process"
    assert {cmd["action"] for cmd in c.commands("n1")} == {"in_process"}
    assert all(d.get("mode") != "shadow" for d in inc["decisions"])
    detail = c.client.get(f"/api/v1/incidents/{inc['id']}").json()
    (sh,) = detail["shadow"]
    assert sh["rule"] == "causes.exception"
    assert (sh["action"], sh["instead_of"], sh["cause"]) == ("launcher", "in_process", "exception")
    assert c.engine.status()["counts"]["shadow"] == 1
    assert c.engine.status()["policy"]["shadow_rules"] == {
        "causes.exception": "launcher",
        "xid.codes.43": "reset_gpu",
    }


def test_evidence_ignored_in_force_is_recorded_when_a_shadow_rule_would_act(
    make_cluster: Any,
) -> None:
    c: Cluster = make_cluster(SHADOW)
    c.job("ig", {"n1": (0,)})
    c.event("n1", "xid", xid=43, gpu_uuid="GPU-0", message="Xid 43")  # IGNORE bucket
    c.decide()
    assert c.incidents("ig") == []  # ignored, as the policy in force says
    assert c.commands("n1") == []
    events = c.client.get("/api/v1/events", params={"kind": "shadow"}).json()
    (ev,) = events
    assert ev["data"]["rule"] == "xid.codes.43"
    assert (ev["data"]["action"], ev["data"]["instead_of"]) == ("reset_gpu", "ignore")
    assert "would have done reset_gpu instead of ignore" in ev["message"]


def test_a_rule_that_agrees_with_the_rule_in_force_records_nothing(make_cluster: Any) -> None:
    same = SHADOW.replace('"launcher", shadow = true', '"in_process", shadow = true')
    c: Cluster = make_cluster(same)
    c.job("agree", {"n1": (0,)})
    c.event("n1", "exception", job="agree", rank=0)
    c.decide()
    (inc,) = c.incidents("agree")
    assert c.client.get(f"/api/v1/incidents/{inc['id']}").json()["shadow"] == []
    assert c.client.get("/api/v1/events", params={"kind": "shadow"}).json() == []


def test_shadow_false_is_an_ordinary_rule(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[causes]\nhang = { action = "launcher", shadow = false }\n')
    policy = load_policy(path)
    assert policy.cause("hang") == "launcher"
    assert policy.shadow is None and policy.shadow_rules == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[causes]\nhang = { action = "launcher", shadow = "yes" }\n',
            "causes.hang.shadow (line 2): true or false (got 'yes')",
        ),
        (
            "[causes]\nhang = { shadow = true }\n",
            "causes.hang (line 2): a rule table takes action and shadow (no action)",
        ),
        (
            '[causes]\nhang = { action = "launcher", shaddow = true }\n',
            "causes.hang (line 2): a rule table takes action and shadow (unknown key 'shaddow')",
        ),
        (
            # the do-no-harm rule holds for shadow rules too
            '[causes]\n\nhang = { action = "exclude_node", shadow = true }\n',
            "causes.hang (line 3): 'exclude_node' needs evidence about a node's hardware",
        ),
    ],
)
def test_a_bad_rule_table_is_refused_with_its_key_and_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(PolicyError) as err:
        load_policy(path)
    assert message in str(err.value)
