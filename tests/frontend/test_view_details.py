"""The views' details an on-call engineer reads at a glance (issue #16, item 6): a step
chart whose time ticks are each a different second, sub-millisecond step times in µs, the
node page's rank table with its heartbeat in view, a GPU that fell off the bus marked
"lost", fault-injection log lines that are no XID, checkpoint rows hidden by the feed's
kind filter, and the jobs table's "Attempt / iteration" header. Each test on a server of
its own, fed over the real ingest route."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.frontend.conftest import Cluster
from tests.frontend.seed import JobSeed, agent_id
from trainguard.protocol import messages

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

Screenshot = Callable[[Page, str], Path]


def sign_in(page: Page, cluster: Cluster) -> Page:
    page.add_init_script(f"sessionStorage.setItem('trainguard.token', {json.dumps(cluster.token)})")
    return page


def batch(node: str, now: float, **parts: Any) -> dict[str, Any]:
    return {
        "node": node,
        "agent_id": agent_id(),
        "seq": 1,
        "sent_at": now,
        "simulated": True,
        **parts,
    }


def test_a_fast_jobs_step_chart_ticks_each_second_once_and_its_steps_read_in_us(
    page: Page, empty_server: Cluster, screenshot: Screenshot
) -> None:
    cluster = empty_server
    now = time.time()
    # Ten steps a second: uPlot's own ticks would fall every 0.2 s and repeat each label.
    fast = JobSeed("fast-job", ["fast-node-1"], ranks_per_node=2, steps=120, step_s=0.1)
    for body in fast.batches(now):
        cluster.api("ingest", body)
    tiny = JobSeed("tiny-job", ["tiny-node-1"], ranks_per_node=2, steps=120, step_s=0.0004)
    for body in tiny.batches(now):
        cluster.api("ingest", body)
    sign_in(page, cluster)

    page.goto(f"{cluster.url}/#/jobs/fast-job")
    chart = page.locator("#step-chart")
    expect(chart).to_have_attribute("data-points", re.compile(r"^[1-9]"))
    expect(chart).to_have_attribute("data-x-ticks", re.compile(r"\d"))
    ticks = (chart.get_attribute("data-x-ticks") or "").split("|")
    assert len(ticks) >= 3, ticks
    assert len(ticks) == len(set(ticks)), f"a time label repeats: {ticks}"
    screenshot(page, "job-fast-steps")

    page.goto(f"{cluster.url}/#/jobs/tiny-job")
    rows = page.locator(".stragglers-table tbody tr")
    unavailable = page.locator("section[aria-labelledby='stragglers-heading'] .unavailable")
    expect(rows.first.or_(unavailable)).to_be_visible()
    if rows.count():
        median = rows.first.locator("td").nth(3)  # after the rank, its node and scores
        expect(median).to_have_text(re.compile(r"^\d{3} µs$"))  # about 400 µs, not "0 ms"
        screenshot(page, "job-sub-ms-steps")


def test_the_node_page_marks_a_lost_gpu_and_shows_the_ranks_heartbeat(
    page: Page, empty_server: Cluster, screenshot: Screenshot
) -> None:
    cluster = empty_server
    node = "lost-node-1"
    now = time.time()
    gpus = [
        {"uuid": f"GPU-{node}-{i}", "index": i, "name": "test GPU", "memory_total_mib": 81559.0}
        for i in range(2)
    ]
    samples = [
        {"uuid": gpus[0]["uuid"], "ts": now, "util": 97.0, "temp_c": 61.0, "power_w": 612.0},
        {"uuid": gpus[1]["uuid"], "ts": now},  # fell off the bus: every reading missing
    ]
    cluster.api("ingest", batch(node, now, gpus=gpus, samples=samples))
    job = JobSeed("node-job", [node], ranks_per_node=2, steps=10, display_name="nightly")
    for body in job.batches(now):
        cluster.api("ingest", body)
    sign_in(page, cluster)

    page.goto(f"{cluster.url}/#/nodes/{node}")
    lost = page.locator(f'.gpus-table tr[data-uuid="{gpus[1]["uuid"]}"]')
    expect(lost).to_have_attribute("data-lost", "true")
    expect(lost.locator(".badge-lost")).to_have_text("lost")
    expect(lost.locator(".badge-lost")).to_have_attribute("title", re.compile("fell off the bus"))
    fine = page.locator(f'.gpus-table tr[data-uuid="{gpus[0]["uuid"]}"]')
    expect(fine).to_have_attribute("data-lost", "false")
    expect(fine.locator(".badge-lost")).to_have_count(0)
    # The node's facts: the server's count (`gpus_lost`), and a lost GPU degrades the node.
    facts = page.locator(".facts")
    expect(facts.locator('[data-field="gpus"]')).to_have_attribute("data-lost", "1")
    expect(facts.locator('[data-field="gpus"]')).to_have_text("2 (1 lost)")
    expect(facts.locator(".status-degraded")).to_have_text("degraded")

    ranks = page.locator(".ranks-table")
    expect(ranks.locator("tbody tr")).to_have_count(2)
    heartbeat = ranks.locator("tbody tr").first.locator("td").last
    expect(heartbeat.locator("time")).to_be_visible()
    # The whole column is in view, not behind the table's scroll bar.
    scroller = page.locator(".ranks-table").locator("xpath=..")
    box, frame = heartbeat.bounding_box(), scroller.bounding_box()
    assert box and frame and box["x"] + box["width"] <= frame["x"] + frame["width"] + 1, (
        box,
        frame,
    )
    screenshot(page, "node-lost-gpu")

    # The overview marks both nodes from the server's count: the one whose every GPU
    # reading is missing and the one with one lost GPU of two, whose averages still read.
    all_lost = "lost-node-2"
    cluster.api(
        "ingest",
        batch(
            all_lost,
            now,
            gpus=[{"uuid": f"GPU-{all_lost}-0", "index": 0, "name": "test GPU"}],
            samples=[{"uuid": f"GPU-{all_lost}-0", "ts": now}],
        ),
    )
    assert {n["name"]: n["gpus_lost"] for n in cluster.api("nodes")} == {node: 1, all_lost: 1}
    page.goto(f"{cluster.url}/#/")
    for name in (node, all_lost):
        tile = page.locator(f'.node-grid a.tile[data-node="{name}"]')
        expect(tile).to_have_attribute("data-lost", "true")
        expect(tile).to_have_attribute("data-gpus-lost", "1")
        expect(tile).to_have_attribute("data-status", "degraded")
        expect(tile.locator(".tile-mark")).to_have_text("1 GPU lost")
    expect(page.locator(".summary .count-lost")).to_have_text("GPUs lost 2")
    expect(page.locator(".summary .count-lost")).to_have_attribute("data-count", "2")
    # The jobs table says what its generation column counts.
    header = page.locator(".jobs-table thead th", has_text="Attempt / iteration")
    expect(header).to_have_attribute("title", re.compile("attempt.*iteration"))
    screenshot(page, "overview-lost-gpus")


def test_a_real_agents_gpu_that_falls_off_the_bus_reads_lost_and_degrades_its_node(
    page: Page, empty_server: Cluster, screenshot: Screenshot
) -> None:
    """A real agent simulating two GPUs; XID 79 injected on GPU 1 through its socket (as
    the fault injector does): the simulated GPU answers no reading from then on, the
    server counts it lost and the dashboard says so, while GPU 0 keeps the averages up."""
    cluster = empty_server
    node = "xid79-node"
    cluster.start_agent(node, gpus=2)
    cluster.wait(lambda: (n := cluster.node(node)) and n["gpu_count"] == 2, "no 2 GPUs")
    cluster.wait(lambda: cluster.node(node)["status"] == "healthy", "never healthy")
    assert cluster.node(node)["gpus_lost"] == 0
    inject = messages.InjectXid(xid=79, gpu=1, message="GPU has fallen off the bus", ts=time.time())
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(messages.encode(inject), str(cluster.data_dir / f"{node}.sock"))
    # The simulated power cycle brings the GPU back after 40 s: this reads well before.
    lost = cluster.wait(lambda: (n := cluster.node(node)) and n["gpus_lost"] == 1 and n, "not lost")
    assert lost["status"] == "degraded" and lost["util_avg"] is not None
    gpus = cluster.api(f"nodes/{node}/gpus")
    assert [g["lost"] for g in gpus] == [False, True]
    sign_in(page, cluster)

    page.goto(f"{cluster.url}/#/")
    tile = page.locator(f'.node-grid a.tile[data-node="{node}"]')
    expect(tile).to_have_attribute("data-gpus-lost", "1")
    expect(tile.locator(".tile-mark")).to_have_text("1 GPU lost")
    expect(tile).to_have_attribute("aria-label", re.compile("1 of 2 GPUs lost"))
    expect(page.locator(".summary .count-lost")).to_have_text("GPUs lost 1")
    screenshot(page, "overview-xid79-agent")

    page.goto(f"{cluster.url}/#/nodes/{node}")
    expect(page.locator('.facts [data-field="gpus"]')).to_have_text("2 (1 lost)")
    row = page.locator(f'.gpus-table tr[data-uuid="{gpus[1]["uuid"]}"]')
    expect(row).to_have_attribute("data-lost", "true")
    expect(row.locator(".badge-lost")).to_have_text("lost")
    expect(page.locator(f'.gpus-table tr[data-uuid="{gpus[0]["uuid"]}"]')).to_have_attribute(
        "data-lost", "false"
    )
    screenshot(page, "node-xid79-agent")


def test_the_feed_hides_checkpoints_by_default_and_an_injection_log_is_no_xid(
    page: Page, empty_server: Cluster, screenshot: Screenshot
) -> None:
    cluster = empty_server
    node = "feed-node-1"
    now = time.time()
    gpu = f"GPU-{node}-0"
    checkpoints = [
        {
            "kind": "checkpoint",
            "ts": now - 60 + i,
            "job": "feed-job",
            "rank": i % 4,
            "message": "checkpoint saved",
            "data": {"phase": "save", "step": 100 + i, "blocking_s": 1.5},
        }
        for i in range(30)
    ]
    injection = {
        "kind": "log",
        "ts": now - 10,
        "job": "feed-job",
        "rank": 1,
        "message": "injecting fault 3: xid XID 79 on rank 1 at step 140",
        "data": {"index": 3, "kind": "xid", "rank": 1, "step": 140, "xid": 79},
    }
    xid = {"kind": "xid", "ts": now - 5, "gpu_uuid": gpu, "xid": 79, "message": "", "data": {}}
    cluster.api(
        "ingest",
        batch(
            node,
            now,
            gpus=[{"uuid": gpu, "index": 0, "name": "test GPU"}],
            events=[*checkpoints, injection, xid],
        ),
    )
    sign_in(page, cluster)
    page.goto(f"{cluster.url}/#/")
    events = page.locator(".events li")
    expect(events).to_have_count(2)  # the 30 checkpoints hidden
    expect(page.locator(".events-hidden")).to_contain_text("30 of the last 32 events hidden")
    log = page.locator('.events li[data-kind="log"]')
    expect(log).to_contain_text("injecting fault 3")
    expect(log.locator(".xid")).to_have_count(0)
    expect(page.locator('.events li[data-kind="xid"] .xid')).to_have_text("XID 79")
    screenshot(page, "events-filtered")

    page.get_by_label("event kinds to show").select_option("all")
    expect(events).to_have_count(32)
    expect(page.locator(".events-hidden")).to_have_text("")
    page.get_by_label("event kinds to show").select_option("checkpoints")
    expect(events).to_have_count(30)
    # The choice holds for a reload of this tab.
    page.reload()
    expect(page.get_by_label("event kinds to show")).to_have_value("checkpoints")
    expect(events).to_have_count(30)
