"""Every view of the dashboard in a real browser against a real server and a real
simulated agent, with a training job reported over the real ingest route (JobFeed): the
node grid, the node's charts and counters, XIDs with their catalog meaning arriving live,
the job's heatmap and charts, a manual restart through the confirmation dialog whose
incident timeline fills in as the (test's) agent acks each phase, and cordon."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.frontend.conftest import (
    JOB,
    JOB_NODES,
    SIM_NODE,
    SLOW_RANK,
    Cluster,
    JobFeed,
    start_server,
)
from tests.frontend.seed import JobSeed, xid_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

Screenshot = Callable[[Page, str], Path]


def live(page: Page) -> None:
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")


def test_the_overview_draws_every_node_as_a_tile_reachable_from_the_keyboard(
    signed_in: Page, cluster: Cluster, job_feed: JobFeed, screenshot: Screenshot
) -> None:
    cluster.api("ingest", xid_batch("xid-node-9", 79, time.time()))
    page = signed_in
    page.goto(cluster.url + "/#/")
    grid = page.locator(".node-grid")
    for name in [SIM_NODE, *JOB_NODES, "xid-node-9"]:
        expect(grid.locator(f'a.tile[data-node="{name}"]')).to_be_visible()
    expect(grid.locator('a.tile[data-node="xid-node-9"]')).to_have_attribute(
        "data-status", "degraded"
    )
    # The node hosting the slow rank turns "straggler" once the analytics flag it (or
    # stays healthy on a server without straggler detection).
    expect(grid.locator(f'a.tile[data-node="{JOB_NODES[1]}"]')).to_have_attribute(
        "data-status", re.compile("straggler|healthy")
    )
    # Counts by state, and the running job with its goodput.
    expect(page.locator('.summary .count[data-status="degraded"]')).to_have_attribute(
        "data-count", re.compile(r"^[1-9]")
    )
    job_row = page.locator(f'.jobs-table tr[data-job="{JOB}"]')
    expect(job_row).to_have_attribute("data-running", "true")
    expect(job_row.locator(".col-goodput")).to_have_text(re.compile(r"\d+\.\d %|n/a"))
    # One tab stop for the whole grid; arrows move, Enter opens the node.
    first = grid.locator("a.tile").first
    first.focus()
    page.keyboard.press("ArrowRight")
    second = grid.locator("a.tile").nth(1)
    expect(second).to_be_focused()
    expect(page.locator(".grid-readout")).to_contain_text(second.get_attribute("data-node") or "")
    name = second.get_attribute("data-node") or ""
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(rf"#/nodes/{re.escape(name)}"))
    page.go_back()
    expect(grid.locator("a.tile").first).to_be_visible()
    screenshot(page, "overview")


def test_the_node_page_charts_memory_power_and_clocks_and_lists_its_counters(
    signed_in: Page, cluster: Cluster, screenshot: Screenshot
) -> None:
    page = signed_in
    page.goto(f"{cluster.url}/#/nodes/{SIM_NODE}")
    live(page)
    for chart in ["#gpu-chart", "#gpu-chart-memory", "#gpu-chart-power", "#gpu-chart-clocks"]:
        root = page.locator(chart)
        expect(root.locator(".uplot canvas")).to_have_count(1)
        expect(root).to_have_attribute("data-value-points", re.compile(r"^[1-9]\d*$"))
    expect(page.locator("#gpu-chart-memory .u-legend")).to_contain_text("Used")
    expect(page.locator("#gpu-chart-clocks .u-legend")).to_contain_text("SM clock")
    counters = page.locator(".counters-table tbody tr")
    expect(counters).to_have_count(2)
    expect(counters.first.locator('td[data-field="ecc_dbe_volatile"]')).to_have_text(
        re.compile(r"^\d+$")
    )
    expect(page.get_by_role("button", name="Cordon…")).to_be_visible()
    # A shorter window reloads the history and stays in the address for a reload.
    page.get_by_label("Window").select_option("120")
    expect(page).to_have_url(re.compile(r"window=120"))
    page.reload()
    expect(page.get_by_label("Window")).to_have_value("120")
    expect(page.locator("#gpu-chart-power")).to_have_attribute(
        "data-value-points", re.compile(r"^[1-9]\d*$")
    )
    # For the screenshot: some 20 s of samples (the agent samples every 0.5 s).
    page.wait_for_function(
        "() => Number(document.querySelector('#gpu-chart').dataset.points) >= 40",
        timeout=30_000,
    )
    screenshot(page, "node")


def test_an_xid_appears_live_in_the_feed_and_the_node_history_with_its_catalog_meaning(
    signed_in: Page, cluster: Cluster, screenshot: Screenshot
) -> None:
    page = signed_in
    page.goto(cluster.url + "/#/")
    live(page)
    page.evaluate("window.__sameDocument = true")
    # XID 48 with no message of its own: the words come from the catalog alone.
    cluster.api("ingest", xid_batch("xid-node-48", 48, time.time()))
    item = page.locator('.events li[data-kind="xid"]', has_text="xid-node-48").first
    expect(item).to_contain_text("XID 48", timeout=5_000)
    expect(item.locator(".xid-meaning")).to_contain_text("double-bit ECC error")
    expect(item.locator(".xid-action")).to_contain_text("reset the GPU")
    assert page.evaluate("window.__sameDocument") is True

    item.get_by_role("link", name="xid-node-48").click()
    history = page.locator(".xid-table tbody tr").first
    expect(history).to_have_attribute("data-xid", "48")
    expect(history).to_contain_text("double-bit ECC error")
    expect(history).to_contain_text("GPU 0")
    screenshot(page, "node-xid")


def test_the_job_page_draws_the_step_heatmap_charts_and_goodput(
    signed_in: Page, cluster: Cluster, job_feed: JobFeed, screenshot: Screenshot
) -> None:
    page = signed_in
    page.goto(f"{cluster.url}/#/jobs")
    row = page.locator(f'.jobs-table tr[data-job="{JOB}"]')
    expect(row).to_have_attribute("data-running", "true")
    screenshot(page, "jobs")
    row.get_by_role("link", name=JOB).click()

    heatmap = page.locator("#step-heatmap")
    expect(heatmap).to_have_attribute("data-ranks", "8")
    expect(heatmap).to_have_attribute("data-steps", re.compile(r"^([89]\d|\d{3})$"))
    expect(heatmap).to_have_attribute("data-cells", re.compile(r"^\d{3,}$"))
    expect(page.locator("#step-chart")).to_have_attribute("data-points", re.compile(r"^[1-9]"))
    expect(page.locator("#step-chart .u-legend")).to_contain_text("Worst rank")
    # The heatmap reads a cell from the keyboard.
    page.locator("#step-heatmap canvas").focus()
    page.keyboard.press("ArrowDown")
    expect(page.locator(".heatmap-readout")).to_contain_text(re.compile(r"rank \d+ · step \d+"))
    # Live: new steps arrive without a reload.
    before = int(heatmap.get_attribute("data-steps") or 0)
    page.wait_for_function(
        "n => Number(document.querySelector('#step-heatmap').dataset.steps) > n",
        arg=before if before < 300 else 0,
    )
    facts = page.locator(".facts")
    expect(facts.locator('[data-field="attempt"]')).to_have_text("0")
    expect(facts.locator('[data-field="iteration"]')).to_have_text("0")
    # Stragglers, goodput and advice: the analytics' answers, or an honest "not available".
    stragglers = page.locator(f'.stragglers-table tr[data-rank="{SLOW_RANK}"]')
    unavailable = "section[aria-labelledby='{}'] .unavailable".format
    expect(stragglers.or_(page.locator(unavailable("stragglers-heading")))).to_be_visible()
    goodput = page.locator(".goodput-big").or_(page.locator(unavailable("goodput-heading")))
    expect(goodput.first).to_be_visible()
    expect(page.locator(".advice-text").or_(page.locator(".unavailable")).first).to_be_visible()
    # A plain reload draws the same view.
    page.reload()
    expect(heatmap).to_have_attribute("data-ranks", "8")
    screenshot(page, "job")


def test_a_manual_restart_from_the_job_page_opens_its_incident_and_the_timeline_fills_in(
    signed_in: Page, cluster: Cluster, job_feed: JobFeed, screenshot: Screenshot
) -> None:
    page = signed_in
    page.goto(f"{cluster.url}/#/jobs/{JOB}")
    expect(page.locator("#step-heatmap")).to_have_attribute("data-ranks", "8")
    page.get_by_role("button", name="Restart…").click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_label("Level")).to_be_focused()
    # Escape cancels and nothing is sent.
    page.keyboard.press("Escape")
    expect(dialog).to_have_count(0)
    expect(page.get_by_role("button", name="Restart…")).to_be_focused()

    page.keyboard.press("Enter")
    dialog.get_by_label("Level").select_option("in_process")
    dialog.get_by_role("button", name="Restart").click()  # no reason yet: refused in place
    expect(dialog.locator(".dialog-message")).to_contain_text("required")
    dialog.get_by_label("Reason").fill("browser test: loss spike")
    dialog.get_by_role("button", name="Restart").click()

    expect(page).to_have_url(re.compile(r"#/incidents/\d+$"))
    incident_id = int(page.url.rsplit("/", 1)[1])
    incident = cluster.api(f"incidents/{incident_id}")
    assert incident["trigger"] == "manual" and incident["level"] == "in_process"
    assert sorted(c["node"] for c in incident["commands"]) == sorted(JOB_NODES)
    gantt = page.locator("#gantt")
    expect(page.locator('[data-field="trigger"]')).to_contain_text("manual by admin")
    expect(page.locator(".reason")).to_contain_text("browser test: loss spike")
    expect(gantt.locator('tr[data-milestone="delivered_at"]')).to_have_attribute(
        "data-reached", "false"
    )
    page.evaluate("window.__sameDocument = true")

    # Each node's agent acks its phases; the page follows over the live stream.
    t0 = time.time()
    for i, phase in enumerate(["delivered", "torn_down", "restarted", "resumed"]):
        for k, command in enumerate(incident["commands"]):
            job_feed.ack(command, phase, t0 + 0.2 + 0.5 * i + 0.05 * k)
    expect(gantt).to_have_attribute("data-reached", "7")
    for milestone in ["delivered_at", "torn_down_at", "restarted_at", "resumed_at"]:
        expect(gantt.locator(f'tr[data-milestone="{milestone}"]')).to_have_attribute(
            "data-reached", "true"
        )
    bars = gantt.locator('.gantt-row[data-row="incident"] .gantt-bar')
    expect(bars).to_have_count(6)
    expect(gantt.locator(f'.gantt-row[data-row="{JOB_NODES[0]}"] .gantt-bar')).to_have_count(4)
    expect(page.locator(".incident-status")).to_have_text("resolved")
    expect(page.locator('[data-field="recovery"]')).to_have_text(re.compile(r"\d"))
    assert page.evaluate("window.__sameDocument") is True
    screenshot(page, "incident")

    page.reload()
    expect(gantt).to_have_attribute("data-reached", "7")
    page.get_by_role("link", name="Incidents", exact=True).first.click()
    row = page.locator(f'.incidents-table tr[data-incident="{incident_id}"]')
    expect(row).to_have_attribute("data-status", "resolved")
    expect(row).to_contain_text("manual (admin)")
    screenshot(page, "incidents")


def test_cordon_and_uncordon_need_a_confirmed_reason(signed_in: Page, cluster: Cluster) -> None:
    node = "cordon-node-1"
    cluster.api("ingest", xid_batch(node, 63, time.time()))
    page = signed_in
    page.goto(f"{cluster.url}/#/nodes/{node}")
    button = page.get_by_role("button", name="Cordon…")
    button.click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_label("Reason (audited)")).to_be_focused()
    page.keyboard.type("HBM errors: drain before the swap")
    page.keyboard.press("Tab")  # Cancel
    page.keyboard.press("Tab")  # Cordon
    page.keyboard.press("Enter")
    expect(dialog).to_have_count(0)  # closed once the server said yes
    assert cluster.node(node)["status"] == "cordoned"
    expect(page.get_by_role("button", name="Uncordon…")).to_be_visible()
    expect(page.locator(".facts")).to_contain_text("cordoned")
    page.get_by_role("button", name="Uncordon…").click()
    dialog.get_by_label("Reason (audited)").fill("swapped")
    dialog.get_by_role("button", name="Uncordon").click()
    expect(dialog).to_have_count(0)
    assert cluster.node(node)["cordoned"] is False
    expect(page.get_by_role("button", name="Cordon…")).to_be_visible()


@pytest.fixture
def dry_run_server(tmp_path: Path, page: Page) -> Iterator[Cluster]:
    """A server whose decision engine only recommends (policy mode dry_run)."""
    policy = tmp_path / "policy.toml"
    policy.write_text('mode = "dry_run"\n')
    cluster = start_server(tmp_path, {"TRAINGUARD_POLICY_FILE": str(policy)})
    yield cluster
    page.goto("about:blank")  # an open live stream holds up the server's graceful exit
    cluster.stop()


def test_a_dry_run_recommendation_waits_for_an_operator_who_approves_it(
    page: Page, dry_run_server: Cluster, screenshot: Screenshot
) -> None:
    cluster = dry_run_server
    feed = JobFeed(cluster, JobSeed(JOB, JOB_NODES, ranks_per_node=4, steps=30), step=30)
    feed.start()
    try:
        cluster.wait(lambda: cluster.api(f"jobs/{JOB}")["world_size"] == 8, "no job")
        now = time.time()
        cluster.api(
            "ingest",
            {
                "node": JOB_NODES[0],
                "agent_id": "exception-test-1",
                "seq": 1,
                "sent_at": now,
                "simulated": True,
                "events": [
                    {
                        "kind": "exception",
                        "ts": now,
                        "job": JOB,
                        "rank": 1,
                        "message": "RuntimeError: loss is NaN",
                    }
                ],
            },
        )
        page.add_init_script(
            f"sessionStorage.setItem('trainguard.token', {json.dumps(cluster.token)})"
        )
        page.goto(cluster.url + "/#/incidents")
        item = page.locator(".pending-item").first
        expect(item).to_contain_text("recommends in_process")
        expect(page.locator(".engine-line")).to_contain_text("mode dry_run")
        screenshot(page, "incidents-pending")
        incident_id = int(item.get_attribute("data-incident") or 0)

        item.get_by_role("button", name="Approve…").click()
        dialog = page.get_by_role("dialog")
        expect(dialog.get_by_label("Reason (audited)")).to_be_focused()
        page.keyboard.type("NaN loss, restart in place")
        dialog.get_by_role("button", name="Approve").click()
        expect(dialog).to_have_count(0)
        expect(page.locator(".pending-item")).to_have_count(0)
        answer = cluster.api(f"incidents/{incident_id}")
        assert answer["status"] in ("open", "resolved")
        assert any(d.get("mode") == "approved" for d in answer["decisions"])

        page.goto(f"{cluster.url}/#/incidents/{incident_id}")
        expect(page.locator(".decisions")).to_contain_text("NaN loss, restart in place")
        evidence = page.locator("section[aria-labelledby='evidence-heading'] li.event")
        expect(evidence.first).to_contain_text("exception")
    finally:
        feed.stop()
