"""Every view of the dashboard in a real browser against a real server and a real
simulated agent, with a training job reported over the real ingest route (JobFeed): the
node grid, the node's charts and counters, XIDs with their catalog meaning arriving live,
the job's heatmap and charts, its state and capabilities, a manual restart through the
confirmation dialog (offering only the levels the job supports, a refusal shown in words)
whose incident timeline fills in as the (test's) agent acks each phase, a finished job,
and cordon / readmit."""

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
from tests.frontend.seed import JobSeed, agent_id, xid_batch

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
    expect(job_row.locator(".job-state")).to_have_text("running")
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
    expect(job_row.locator(".col-goodput")).to_have_text(re.compile(r"\d+\.\d %|n/a"))
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
    expect(row.locator(".job-state")).to_have_text("running")
    expect(row.locator(".job-state")).to_have_class(re.compile(r"\bjob-state-running\b"))
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
    facts = page.locator(".facts").first
    expect(page.locator(".state-slot .job-state")).to_have_text("running")
    # What its ranks declared: all under NVRx's Wrapper, under ft_launcher.
    caps = page.locator("#capabilities")
    expect(caps.locator('[data-field="in-process"]')).to_contain_text("yes")
    expect(caps.locator('[data-field="launchers"]')).to_contain_text("ft_launcher")
    expect(caps.locator('[data-field="levels"]')).to_have_attribute(
        "data-levels", "in_process,launcher"
    )
    # Every rank declared the same: the capabilities say it, not a column per rank.
    expect(page.locator("#step-heatmap")).to_have_attribute("data-ranks", "8")
    expect(page.locator(".ranks-table thead")).not_to_contain_text("Runs under")
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
    # The job runs under the Wrapper and a launcher: both levels, the cheapest first.
    options = dialog.get_by_label("Level").locator("option")
    expect(options).to_have_count(2)
    assert options.evaluate_all("els => els.map(e => e.value)") == ["in_process", "launcher"]
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


def test_the_restart_dialog_offers_only_the_jobs_levels_and_says_why_one_is_refused(
    signed_in: Page, cluster: Cluster, screenshot: Screenshot
) -> None:
    name = "wrap-job"
    seed = JobSeed(
        name,
        ["wrap-node-1"],
        ranks_per_node=2,
        steps=20,
        slow_rank=None,
        in_process=True,
        launcher="torchrun",
    )

    def levels() -> list[str]:
        return cluster.api(f"jobs/{name}")["capabilities"]["levels"]

    feed = JobFeed(cluster, seed, step=20)
    feed.start()
    try:
        cluster.wait(lambda: levels() == ["in_process", "launcher"], "the job never declared both")
        page = signed_in
        page.goto(f"{cluster.url}/#/jobs/{name}")
        expect(page.locator('#capabilities [data-field="in-process"]')).to_contain_text("yes")
        page.get_by_role("button", name="Restart…").click()
        dialog = page.get_by_role("dialog")
        level = dialog.get_by_label("Level")
        expect(level.locator("option")).to_have_count(2)

        # Its ranks restart without the Wrapper while the dialog is open: the server refuses
        # in_process with 409, and the dialog says why in words and stays open.
        seed.in_process = False
        cluster.wait(lambda: levels() == ["launcher"], "the new declaration never arrived")
        level.select_option("in_process")
        dialog.get_by_label("Reason").fill("browser test: a level the job lost")
        dialog.get_by_role("button", name="Restart").click()
        message = dialog.locator(".dialog-message")
        expect(message).to_contain_text("Refused by the server")
        expect(message).to_contain_text("Wrapper")
        expect(message).not_to_contain_text("409")
        expect(dialog).to_be_visible()
        # The page re-read what the job can do.
        expect(page.locator('#capabilities [data-field="in-process"]')).to_contain_text("no")
        screenshot(page, "job-restart-refused")
        page.keyboard.press("Escape")
        expect(dialog).to_have_count(0)
        assert cluster.api(f"incidents?job={name}") == []  # nothing was changed

        # A job without the Wrapper is offered the launcher level only, and told why.
        page.get_by_role("button", name="Restart…").click()
        expect(level.locator("option")).to_have_count(1)
        expect(level.locator("option")).to_have_attribute("value", "launcher")
        expect(dialog.locator(".field-help")).to_contain_text("In-process is not offered")
        page.keyboard.press("Escape")
        expect(page.locator('#capabilities [data-field="levels"]')).to_have_attribute(
            "data-levels", "launcher"
        )
    finally:
        feed.stop()


def budget_job(cluster: Cluster, name: str, node: str) -> JobFeed:
    """A torchrun job of 2 ranks on `node` whose launcher has used 2 of its 3 restarts,
    fed live until the API shows the one left."""
    seed = JobSeed(
        name,
        [node],
        ranks_per_node=2,
        steps=20,
        slow_rank=None,
        in_process=False,
        launcher="torchrun",
        max_restarts=3,
        restart_count=2,
    )
    feed = JobFeed(cluster, seed, step=20)
    feed.start()
    try:
        cluster.wait(lambda: cluster.api(f"jobs/{name}")["restarts_left"] == 1, "no budget arrived")
    except BaseException:
        feed.stop()
        raise
    return feed


def test_the_job_page_shows_the_launchers_restarts_left_and_the_dialog_offers_the_force(
    signed_in: Page, cluster: Cluster, screenshot: Screenshot
) -> None:
    name = "budget-job"
    feed = budget_job(cluster, name, "budget-node-1")
    try:
        page = signed_in
        page.goto(f"{cluster.url}/#/jobs/{name}")
        left = page.locator('#capabilities [data-field="restarts-left"]')
        expect(left).to_have_attribute("data-left", "1")
        expect(left).to_contain_text("1 of 3")
        expect(left).to_contain_text("needs force")
        page.get_by_role("button", name="Restart…").click()
        dialog = page.get_by_role("dialog")
        force = dialog.get_by_label("Use the launcher's last restart anyway (force)")
        expect(force).to_be_hidden()  # offered only once the server refuses
        dialog.get_by_label("Reason").fill("browser test: the last launcher restart")
        dialog.get_by_role("button", name="Restart").click()
        message = dialog.locator(".dialog-message")
        expect(message).to_contain_text("the launcher allows 3 restarts")
        expect(message).to_contain_text("--max-restarts")
        expect(force).to_be_visible()
        screenshot(page, "job-restart-budget")
        assert cluster.api(f"incidents?job={name}") == []  # refused: nothing changed
        force.check()
        dialog.get_by_role("button", name="Restart").click()
        expect(page).to_have_url(re.compile(r"#/incidents/\d+$"))
        (inc,) = cluster.api(f"incidents?job={name}")
        assert inc["level"] == "launcher" and "forced" in inc["decisions"][-1]["why"]
    finally:
        feed.stop()


def test_a_fault_that_would_use_the_launchers_last_restart_waits_for_an_operator(
    signed_in: Page, cluster: Cluster, screenshot: Screenshot
) -> None:
    name = "held-job"
    feed = budget_job(cluster, name, "held-node-1")
    try:
        now = time.time()
        death = {"kind": "rank_exit", "ts": now, "job": name, "rank": 1, "data": {"signal": 9}}
        envelope = {"agent_id": agent_id(), "seq": 1, "sent_at": now, "simulated": True}
        cluster.api("ingest", {"node": "held-node-1", **envelope, "events": [death]})
        held = cluster.wait(
            lambda: next(iter(cluster.api(f"incidents?status=pending&job={name}")), None),
            "the engine held nothing",
        )
        assert held["decisions"][-1]["mode"] == "budget" and held["commands"] == [], held
        page = signed_in
        page.goto(cluster.url + "/#/incidents")
        item = page.locator(f'.pending-item[data-incident="{held["id"]}"]')
        expect(item).to_have_attribute("data-held", "budget")
        expect(item).to_contain_text("Held for the launcher's last restart")
        page.goto(f"{cluster.url}/#/incidents/{held['id']}")
        box = page.locator(".pending-box")
        expect(box).to_have_attribute("data-held", "budget")
        expect(box).to_contain_text("Held: the launcher's last restart")
        expect(box).to_contain_text("the launcher allows 3 restarts")
        page.get_by_role("button", name="Approve…").click()
        expect(page.get_by_role("dialog")).to_contain_text("using the launcher's last restart")
        screenshot(page, "incident-budget-held")
        page.keyboard.press("Escape")
    finally:
        feed.stop()


def test_a_held_exclusion_whose_job_ended_is_a_question_about_its_node(
    signed_in: Page, cluster: Cluster, screenshot: Screenshot
) -> None:
    """#33: an exclusion held for an operator outlives its job as a question about the
    node only; approved, it cordons the node and restarts nothing."""
    name, node = "ended-held-job", "ended-held-node-1"
    feed = budget_job(cluster, name, node)
    try:
        cluster.api("ingest", xid_batch(node, 79, time.time(), "GPU has fallen off the bus"))
        held = cluster.wait(
            lambda: next(iter(cluster.api(f"incidents?status=pending&job={name}")), None),
            "the engine held nothing",
        )
        assert held["level"] == "exclude_node", held
    finally:
        feed.stop()
    for body in feed.seed.exit_batches(time.time(), exit_code=0):
        cluster.api("ingest", body)
    held = cluster.wait(
        lambda: (
            (i := cluster.api(f"incidents/{held['id']}"))["decisions"][-1]["mode"] == "node_only"
            and i
        ),
        "the held exclusion never became the node's question",
    )
    assert cluster.api(f"jobs/{name}")["state"] == "finished"
    page = signed_in
    page.goto(cluster.url + "/#/incidents")
    item = page.locator(f'.pending-item[data-incident="{held["id"]}"]')
    expect(item).to_have_attribute("data-held", "node")
    expect(item).to_contain_text("About the node only, its job ended")
    expect(item.get_by_role("link", name=node)).to_be_visible()
    page.goto(f"{cluster.url}/#/incidents/{held['id']}")
    box = page.locator(".pending-box")
    expect(box).to_have_attribute("data-held", "node")
    expect(box).to_contain_text(f"approving now cordons {node} only")
    page.get_by_role("button", name="Approve…").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text(f"Job {name} has ended: nothing is restarted")
    screenshot(page, "incident-node-question")
    page.keyboard.type("the GPU is gone: cordon it")
    dialog.get_by_role("button", name="Approve").click()
    expect(page.locator(".pending-box")).to_have_count(0)
    done = cluster.wait(
        lambda: (i := cluster.api(f"incidents/{held['id']}"))["status"] == "resolved" and i,
        "the approved question never resolved",
    )
    assert f"cordoned {node}; the job had finished: nothing is restarted" in done["outcome"]
    assert done["commands"] == [] and cluster.node(node)["cordoned"] is True


def test_the_ranks_that_run_without_the_wrapper_are_named_on_the_job_page(
    signed_in: Page, cluster: Cluster
) -> None:
    name = "mixed-job"
    seed = JobSeed(
        name,
        ["mixed-node-1", "mixed-node-2"],
        ranks_per_node=2,
        steps=5,
        slow_rank=None,
        in_process=True,
        launcher="torchrun",
    )
    first, second = seed.batches(time.time())
    for status in second["ranks"]:  # the second node's ranks run without the Wrapper
        status["in_process"] = False
    for body in (first, second):
        cluster.api("ingest", body)
    page = signed_in
    page.goto(f"{cluster.url}/#/jobs/{name}")
    ranks = page.locator(".ranks-table tbody tr")
    expect(ranks).to_have_count(4)
    expect(page.locator(".ranks-table thead")).to_contain_text("Runs under")
    expect(ranks.nth(0).locator('[data-field="in-process"]')).to_have_text("Wrapper")
    expect(ranks.nth(0).locator('[data-field="launcher"]')).to_have_text("torchrun")
    expect(ranks.nth(2).locator('[data-field="in-process"]')).to_have_text("no Wrapper")


def test_a_finished_job_says_so_and_when_it_ended_on_the_overview_the_jobs_list_and_its_page(
    signed_in: Page, cluster: Cluster, job_feed: JobFeed, screenshot: Screenshot
) -> None:
    name = "finished-job"
    seed = JobSeed(
        name,
        ["done-node-1"],
        ranks_per_node=2,
        steps=20,
        slow_rank=None,
        launcher="torchrun",
        in_process=False,
        display_name="pretrain-3f2a",
    )
    for body in seed.batches(time.time()):
        cluster.api("ingest", body)
    ended = time.time()
    for body in seed.exit_batches(ended, exit_code=0):
        cluster.api("ingest", body)
    job = cluster.wait(
        lambda: (j := cluster.api(f"jobs/{name}"))["state"] == "finished" and j,
        "the job never finished",
    )
    assert job["ended_at"] is not None

    page = signed_in
    page.goto(cluster.url + "/#/")
    row = page.locator(f'.jobs-table tr[data-job="{name}"]')
    expect(row).to_have_attribute("data-state", "finished")
    expect(row.locator(".job-state")).to_have_text("finished")
    expect(row.locator(".job-state")).to_have_class(re.compile(r"\bjob-state-finished\b"))
    expect(row.locator(".job-ended time")).to_have_attribute("data-ts", str(job["ended_at"]))
    expect(row.get_by_role("link", name="pretrain-3f2a")).to_be_visible()
    # The running job keeps its own, different badge.
    expect(page.locator(f'.jobs-table tr[data-job="{JOB}"] .job-state')).to_have_text("running")

    page.get_by_role("link", name="Jobs", exact=True).first.click()
    row = page.locator(f'.jobs-table tr[data-job="{name}"]')
    expect(row.locator(".job-state")).to_have_text("finished")
    expect(row.locator(".job-ended")).to_contain_text("ended")
    screenshot(page, "jobs-finished")

    row.get_by_role("link", name="pretrain-3f2a").click()
    expect(page.locator(".state-slot .job-state")).to_have_text("finished")
    expect(page.get_by_role("heading", level=1)).to_contain_text("pretrain-3f2a")
    facts = page.locator(".facts").first
    expect(facts.locator('[data-field="ended"] time')).to_have_attribute(
        "data-ts", str(job["ended_at"])
    )
    expect(facts.locator('[data-field="state-reason"]')).to_contain_text("exited 0")
    # Nothing to restart: the control says so instead of failing on a click.
    expect(page.get_by_role("button", name="Restart…")).to_be_disabled()
    expect(page.locator("#restart-note")).to_contain_text("finished")
    screenshot(page, "job-finished")


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
    # (The server commits just after it answers: wait until the change is visible.)
    cluster.wait(lambda: cluster.node(node)["status"] == "cordoned", "the node was not cordoned")
    # The cordon panel: who and why, and the readmit control.
    panel = page.locator("#cordon-panel")
    expect(panel.locator('[data-field="cordon-by"]')).to_have_text("admin")
    expect(panel.locator('[data-field="cordon-reason"]')).to_have_text(
        "HBM errors: drain before the swap"
    )
    expect(page.get_by_role("button", name="Cordon…")).to_be_hidden()
    expect(page.locator(".facts").first).to_contain_text("cordoned")
    page.get_by_role("button", name="Readmit…").click()
    dialog.get_by_label("Reason (audited)").fill("swapped")
    dialog.get_by_role("button", name="Readmit").click()
    expect(dialog).to_have_count(0)
    cluster.wait(lambda: cluster.node(node)["cordoned"] is False, "the node was not readmitted")
    expect(page.get_by_role("button", name="Cordon…")).to_be_visible()
    expect(page.get_by_role("button", name="Cordon…")).to_be_focused()
    # Its history keeps both: cordoned by admin, readmitted by admin with the reason.
    first = panel.locator(".cordons-table tbody tr").first
    expect(first).to_have_attribute("data-open", "false")
    expect(first).to_contain_text("swapped")


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
        answered = [d for d in answer["decisions"] if d.get("mode") == "approval"]
        assert [d["why"] for d in answered] == ["NaN loss, restart in place"]
        # The engine carries the approval out at its next cycle, not within the request.
        cluster.wait(
            lambda: any(
                d.get("mode") == "approved"
                for d in cluster.api(f"incidents/{incident_id}")["decisions"]
            ),
            "the engine never carried out the approved recommendation",
        )

        page.goto(f"{cluster.url}/#/incidents/{incident_id}")
        expect(page.locator(".decisions")).to_contain_text("NaN loss, restart in place")
        evidence = page.locator("section[aria-labelledby='evidence-heading'] li.event")
        expect(evidence.first).to_contain_text("exception")
    finally:
        feed.stop()
