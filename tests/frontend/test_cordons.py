"""Cordons in a real browser, against a real server whose decision engine cordons a node
on an XID 79 of a job's node (over the real ingest route): the overview marks the node
and says why on its tile and in its table, the node page shows the cordon (trainguard,
the incident, the evidence, since when), the repair flag and the history, and an operator
readmits it with a reason. A second XID 79 passes the breaker's cap (max(1, 25 %) of the
cluster's 4 nodes): its exclusion waits for an operator, says why, and is approved.

The tests share one scenario and run in file order: looking first, then approving, then
readmitting."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.frontend.conftest import Cluster, JobFeed, start_server
from tests.frontend.seed import JobSeed, xid_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

Screenshot = Callable[[Page, str], Path]

JOB = "guarded-job"
NODES = ["rack-a-1", "rack-a-2", "rack-a-3", "rack-a-4"]
CORDONED, HELD = NODES[0], NODES[1]


@dataclass
class Guarded:
    cluster: Cluster
    cordon: dict[str, Any]  # the engine's cordon of CORDONED
    held: dict[str, Any]  # the incident whose exclusion of HELD the breaker holds


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    data = tmp_path_factory.mktemp("guarded")
    policy = data / "policy.toml"
    # No cooldown between the two faults' incidents; the ladder never stops the job here.
    policy.write_text("[limits]\ncooldown_s = 0\n[escalation]\nexclude_node = 10\n")
    cluster = start_server(data, {"TRAINGUARD_POLICY_FILE": str(policy)})
    seed = JobSeed(
        JOB,
        NODES,
        ranks_per_node=2,
        steps=30,
        slow_rank=None,
        in_process=True,
        launcher="ft_launcher",
    )
    feed = JobFeed(cluster, seed, step=30)
    try:
        # Cordoned by an operator and readmitted twice this week, before the job came (a
        # node with live ranks needs force: it would leave their jobs): a third cordon
        # flags it. (The server commits after it answered: each step waits until it is
        # visible.)
        bare = xid_batch(CORDONED, 79, time.time())
        bare["events"] = []
        cluster.api("ingest", bare)
        cluster.wait(lambda: cluster.node(CORDONED), "no node")
        for _ in range(2):
            cluster.api(f"nodes/{CORDONED}/cordon", {"reason": "flaky NVLink"})
            cluster.wait(lambda: cluster.node(CORDONED)["cordoned"], "no operator cordon")
            cluster.api(f"nodes/{CORDONED}/uncordon", {"reason": "reseated the cable"})
            cluster.wait(lambda: not cluster.node(CORDONED)["cordoned"], "no readmission")
        feed.start()
        cluster.wait(lambda: cluster.api(f"jobs/{JOB}")["world_size"] == 8, "no job")
        cluster.api("ingest", xid_batch(CORDONED, 79, time.time(), "GPU has fallen off the bus"))
        node = cluster.wait(
            lambda: (
                (n := cluster.node(CORDONED)) and (n["cordon"] or {}).get("by") == "engine" and n
            ),
            "the engine never cordoned the node",
        )
        cluster.api("ingest", xid_batch(HELD, 79, time.time(), "GPU has fallen off the bus"))
        held = cluster.wait(
            lambda: next(iter(cluster.api(f"incidents?status=pending&job={JOB}")), None),
            "the breaker held nothing",
        )
        assert held["decisions"][-1]["mode"] == "breaker", held
        yield Guarded(cluster, node["cordon"], held)
    finally:
        feed.stop()
        cluster.stop()


@pytest.fixture
def page_in(page: Page, guarded: Guarded) -> Page:
    page.add_init_script(
        f"sessionStorage.setItem('trainguard.token', {json.dumps(guarded.cluster.token)})"
    )
    return page


def test_the_overview_marks_the_cordoned_node_and_says_why(
    page_in: Page, guarded: Guarded, screenshot: Screenshot
) -> None:
    page = page_in
    incident = guarded.cordon["incident_id"]
    page.goto(guarded.cluster.url + "/#/")
    tile = page.locator(f'.node-grid a.tile[data-node="{CORDONED}"]')
    expect(tile).to_have_attribute("data-status", "cordoned")
    expect(tile).to_have_attribute("data-repair", "true")
    expect(tile.locator(".tile-mark")).to_have_text("repair")
    # Its tooltip (and the readout, from the keyboard) says who, since when and why.
    expect(tile).to_have_attribute(
        "title", re.compile(rf"cordoned by trainguard since .*incident #{incident}")
    )
    expect(tile).to_have_attribute("title", re.compile(r"evidence: .*79"))
    expect(tile).to_have_attribute("title", re.compile(r"flagged for repair \(3 cordons"))
    tile.focus()
    expect(page.locator(".grid-readout")).to_contain_text("cordoned by trainguard")
    # The table of nodes needing attention: the cordon with its incident link.
    row = page.locator(f'.nodes-table tr[data-node="{CORDONED}"]')
    expect(row.locator(".col-status")).to_have_text("cordoned")
    expect(row.locator(".col-cordon")).to_contain_text("by trainguard")
    expect(row.locator(".col-cordon .badge-repair")).to_be_visible()
    expect(row.get_by_role("link", name=f"incident #{incident}")).to_have_attribute(
        "href", f"#/incidents/{incident}"
    )
    # The exclusion the breaker held is among the open incidents, and says so.
    item = page.locator(f'.incident-item[data-incident="{guarded.held["id"]}"]')
    expect(item).to_contain_text("held by the breaker")
    screenshot(page, "overview-cordoned")


def test_the_node_page_shows_the_cordon_its_evidence_the_repair_flag_and_the_history(
    page_in: Page, guarded: Guarded, screenshot: Screenshot
) -> None:
    page = page_in
    incident = guarded.cordon["incident_id"]
    page.goto(f"{guarded.cluster.url}/#/nodes/{CORDONED}")
    panel = page.locator("#cordon-panel")
    expect(panel).to_be_visible()
    expect(panel.locator('[data-field="cordon-by"]')).to_have_text("trainguard")
    expect(panel.locator('[data-field="cordon-reason"]')).to_contain_text(f"incident {incident}")
    expect(panel.locator('[data-field="cordon-evidence"]')).to_contain_text("79")
    expect(panel.locator('[data-field="cordons-recent"]')).to_have_text("3")
    expect(panel.locator(".repair-note")).to_contain_text("Flagged for repair")
    expect(page.locator(".node-header .badge-repair")).to_have_text("flagged for repair")
    expect(page.get_by_role("button", name="Readmit…")).to_be_visible()
    expect(page.get_by_role("button", name="Cordon…")).to_be_hidden()
    # The history, newest first: the engine's open cordon, then the operator's two.
    rows = panel.locator(".cordons-table tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.first).to_have_attribute("data-open", "true")
    expect(rows.first).to_contain_text("still cordoned")
    expect(rows.nth(1)).to_contain_text("flaky NVLink")
    expect(rows.nth(1)).to_contain_text("reseated the cable")
    screenshot(page, "node-cordoned")
    # The incident is one click away.
    panel.locator('[data-field="cordon-incident"] a').click()
    expect(page).to_have_url(re.compile(rf"#/incidents/{incident}$"))
    expect(page.locator('[data-field="level"]')).to_have_text("exclude_node")


def test_an_exclusion_held_by_the_breaker_says_why_and_an_operator_approves_it(
    page_in: Page, guarded: Guarded, screenshot: Screenshot
) -> None:
    page = page_in
    cluster, held = guarded.cluster, guarded.held
    page.goto(cluster.url + "/#/incidents")
    item = page.locator(f'.pending-item[data-incident="{held["id"]}"]')
    expect(item).to_have_attribute("data-held", "breaker")
    expect(item).to_contain_text("Held by the breaker")
    expect(item).to_contain_text("reach the breaker's cap")
    expect(item.get_by_role("link", name=HELD)).to_be_visible()
    screenshot(page, "incidents-held")

    item.get_by_role("link", name=f"#{held['id']}").click()
    box = page.locator(".pending-box")
    expect(box).to_have_attribute("data-held", "breaker")
    expect(box).to_contain_text("Held by the breaker")
    expect(box).to_contain_text(f"exclusion of {HELD} waits for an operator")
    expect(page.locator(".incident-status")).to_have_text("pending")
    screenshot(page, "incident-held")

    page.get_by_role("button", name="Approve…").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text(f"cordon {HELD}")
    expect(dialog.get_by_label("Reason (audited)")).to_be_focused()
    page.keyboard.type("checked the rack: a second bad GPU")
    dialog.get_by_role("button", name="Approve").click()
    expect(dialog).to_have_count(0)
    expect(page.locator(".pending-box")).to_have_count(0)
    expect(page.locator(".incident-status")).not_to_have_text("pending")
    node = cluster.wait(
        lambda: (n := cluster.node(HELD)) and n["cordoned"] and n,
        "the approved exclusion never cordoned the node",
    )
    assert node["cordon"]["incident_id"] == held["id"]


def test_an_operator_readmits_a_node_flagged_for_repair_with_a_reason(
    page_in: Page, guarded: Guarded, screenshot: Screenshot
) -> None:
    page = page_in
    cluster = guarded.cluster
    page.goto(f"{cluster.url}/#/nodes/{CORDONED}")
    readmit = page.get_by_role("button", name="Readmit…")
    readmit.click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("flagged for repair")
    expect(dialog.get_by_label("Reason (audited)")).to_be_focused()
    screenshot(page, "node-readmit-dialog")
    dialog.get_by_role("button", name="Readmit").click()  # no reason yet: refused in place
    expect(dialog.locator(".dialog-message")).to_contain_text("required")
    dialog.get_by_label("Reason (audited)").fill("GPU 0 replaced, dcgmi diag -r 2 passed")
    dialog.get_by_role("button", name="Readmit").click()
    expect(dialog).to_have_count(0)
    # (The server commits just after it answers: wait until the change is visible.)
    node = cluster.wait(
        lambda: (n := cluster.node(CORDONED)) and not n["cordoned"] and n, "not readmitted"
    )
    assert node["cordon"] is None
    panel = page.locator("#cordon-panel")
    expect(panel.locator(".cordon-headline")).to_contain_text("Not cordoned")
    expect(panel.locator(".cordon-headline")).to_contain_text("by admin")
    first = panel.locator(".cordons-table tbody tr").first
    expect(first).to_have_attribute("data-open", "false")
    expect(first).to_contain_text("GPU 0 replaced")
    expect(page.get_by_role("button", name="Cordon…")).to_be_focused()
    (latest, *_) = cluster.api(f"nodes/{CORDONED}/cordons")
    assert latest["by"] == "engine" and latest["released_by"] == "admin"


def test_a_cordon_of_a_node_with_live_ranks_asks_to_take_it_out_of_its_job(
    page_in: Page, guarded: Guarded, screenshot: Screenshot
) -> None:
    # (Last: it takes a node out of the scenario's job.)
    page = page_in
    cluster = guarded.cluster
    node = NODES[2]
    page.goto(f"{cluster.url}/#/nodes/{node}")
    page.get_by_role("button", name="Cordon…").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("also leaves their jobs")
    force = dialog.get_by_label("Take the node out of its running jobs (force)")
    expect(force).to_be_hidden()
    dialog.get_by_label("Reason (audited)").fill("fan at 100 %")
    dialog.get_by_role("button", name="Cordon").click()
    expect(dialog.locator(".dialog-message")).to_contain_text(f"{node} hosts live ranks of job")
    expect(force).to_be_visible()
    assert cluster.node(node)["cordoned"] is False  # refused: nothing changed
    force.check()
    screenshot(page, "node-cordon-force-dialog")
    dialog.get_by_role("button", name="Cordon").click()
    expect(dialog).to_have_count(0)
    cluster.wait(lambda: cluster.node(node)["cordoned"], "not cordoned")
    (inc,) = [
        i
        for i in cluster.api(f"incidents?job={JOB}")
        if i["cause"] == "operator" and i["node"] == node
    ]
    assert inc["level"] == "exclude_node"
    assert ("exclude_node", node) in {(x["action"], x["node"]) for x in inc["commands"]}
