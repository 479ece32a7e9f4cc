"""The dashboard in a real browser, against a real `trainguard server` fed by a real
`trainguard agent --simulate 2`: sign-in, the overview, the node page's chart, and live
updates arriving without a reload."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.frontend.conftest import SIM_NODE, Cluster
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

Screenshot = Callable[[Page, str], Path]


def node_row(page: Page, name: str):
    return page.locator(f'tr[data-node="{name}"]')


def list_all_nodes(page: Page) -> None:
    """The overview's table lists the nodes needing attention; ask it for all of them."""
    page.locator("#status-filter").select_option("*")


def test_sign_in_then_the_overview_shows_the_simulated_node(
    page: Page, cluster: Cluster, screenshot: Screenshot
) -> None:
    page.goto(cluster.url + "/")
    expect(page.get_by_label("Access token")).to_be_focused()
    expect(page.locator("#conn")).to_have_text(re.compile("offline"))
    screenshot(page, "login")

    page.get_by_label("Access token").fill("not-the-token-at-all")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator(".login-message")).to_contain_text("rejected")

    page.get_by_label("Access token").fill(cluster.token)
    page.keyboard.press("Enter")  # the form is usable from the keyboard alone

    tile = page.locator(f'.node-grid a.tile[data-node="{SIM_NODE}"]')
    expect(tile).to_have_attribute("data-simulated", "true")
    expect(tile).to_have_attribute("data-status", re.compile("healthy|degraded"))
    list_all_nodes(page)
    row = node_row(page, SIM_NODE)
    expect(row).to_be_visible()
    expect(row.locator(".col-gpus")).to_have_text("2")
    expect(row.locator(".badge-simulated")).to_have_text("simulated")
    expect(row.locator(".col-status")).to_have_text(re.compile("healthy|degraded"))
    expect(row.locator(".col-util")).to_have_text(re.compile(r"\d+ %"))
    expect(row.locator(".col-temp")).to_have_text(re.compile(r"\d+ °C"))
    # Last seen: local time on screen, the UTC instant on hover.
    expect(row.locator(".col-seen time")).to_have_attribute("title", re.compile(r" UTC$"))
    expect(page.locator("#conn")).to_have_text(re.compile("live"))

    # The token is kept for this tab only.
    assert page.evaluate("sessionStorage.getItem('trainguard.token')") == cluster.token
    assert page.evaluate("localStorage.length") == 0
    screenshot(page, "overview-first-sign-in")


def test_overview_updates_live_without_a_reload(signed_in: Page, cluster: Cluster) -> None:
    page = signed_in
    page.goto(cluster.url + "/#/")
    list_all_nodes(page)
    seen = node_row(page, SIM_NODE).locator(".col-seen time")
    expect(seen).to_be_visible()
    expect(page.locator("#conn")).to_have_text(re.compile("live"))
    page.evaluate("window.__sameDocument = true")
    first = float(seen.get_attribute("data-ts") or 0)
    page.wait_for_function(
        """([sel, first]) => {
            const el = document.querySelector(sel);
            return el && Number(el.dataset.ts) > first;
        }""",
        arg=[f'tr[data-node="{SIM_NODE}"] .col-seen time', first],
    )
    assert page.evaluate("window.__sameDocument") is True
    assert page.locator(".updated").get_attribute("data-source") == "live"


def test_node_page_charts_a_gpu_from_its_history(
    signed_in: Page, cluster: Cluster, screenshot: Screenshot
) -> None:
    gpus = cluster.api(f"nodes/{SIM_NODE}/gpus")
    first = min(gpus, key=lambda g: g["index"])

    def history_points() -> int:
        answer = cluster.api(f"gpus/{first['uuid']}/samples?since={time.time() - 600}&points=300")
        return sum(v is not None for v in answer["columns"]["util"])

    cluster.wait(lambda: history_points() >= 5, "the GPU never had 5 stored samples")

    page = signed_in
    page.goto(f"{cluster.url}/#/nodes/{SIM_NODE}")
    expect(page.get_by_role("heading", level=1)).to_have_text(SIM_NODE)
    rows = page.locator(".gpus-table tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first.locator(".badge-simulated")).to_be_visible()

    chart = page.locator("#gpu-chart")
    expect(chart).to_have_attribute("data-uuid", first["uuid"])
    expect(chart).to_have_attribute("data-simulated", "true")
    expect(page.locator("#chart-heading .badge-simulated")).to_have_text("simulated")
    expect(chart.locator(".uplot canvas")).to_have_count(1)
    # The history answer drew at least the 5 stored samples.
    expect(chart).to_have_attribute("data-history-points", re.compile(r"^([5-9]|\d\d+)$"))
    expect(chart).not_to_have_attribute("data-loading", "true")
    assert int(chart.get_attribute("data-points") or 0) >= 5
    # The legend names both series on their own scales.
    expect(chart.locator(".u-legend")).to_contain_text("Utilisation")
    expect(chart.locator(".u-legend")).to_contain_text("Temperature")
    # The selection is in the address, so a reload shows the same GPU.
    assert page.url.endswith(f"?gpu={first['uuid']}")
    screenshot(page, "node")


def test_a_new_sample_reaches_the_chart_without_a_reload(signed_in: Page, cluster: Cluster) -> None:
    page = signed_in
    page.goto(f"{cluster.url}/#/nodes/{SIM_NODE}")
    chart = page.locator("#gpu-chart")
    expect(chart).to_have_attribute("data-last-ts", re.compile(r"^\d"))
    expect(page.locator("#conn")).to_have_text(re.compile("live"))
    page.evaluate("window.__sameDocument = true")
    before = float(chart.get_attribute("data-last-ts") or 0)
    page.wait_for_function(
        "before => Number(document.querySelector('#gpu-chart').dataset.lastTs) > before",
        arg=before,
    )
    assert page.evaluate("window.__sameDocument") is True
    # The "last sample" line follows the chart.
    shown = float(page.locator(".last-sample").get_attribute("data-ts") or 0)
    assert shown > before


def test_choosing_another_gpu_from_the_keyboard_charts_it(
    signed_in: Page, cluster: Cluster
) -> None:
    page = signed_in
    page.goto(f"{cluster.url}/#/nodes/{SIM_NODE}")
    rows = page.locator(".gpus-table tbody tr")
    expect(rows).to_have_count(2)
    second = rows.nth(1)
    uuid_ = second.get_attribute("data-uuid")

    def choose() -> bool:
        # A live update may re-render the table between focus and Enter (the focus goes
        # with the old row): press again on the row as it is now.
        second.get_by_role("button", name="Show chart").focus()
        page.keyboard.press("Enter")
        return page.locator("#gpu-chart").get_attribute("data-uuid") == uuid_

    wait_for(choose, 20, 0.5)
    expect(page.locator("#gpu-chart")).to_have_attribute("data-uuid", uuid_ or "")
    expect(second.get_by_role("button")).to_have_attribute("aria-pressed", "true")
    expect(page.locator("#chart-heading")).to_contain_text("GPU 1")
    expect(page.locator("#gpu-chart")).to_have_attribute("data-last-ts", re.compile(r"^\d"))


def test_an_xid_event_is_prepended_live_with_its_code(signed_in: Page, cluster: Cluster) -> None:
    page = signed_in
    page.goto(cluster.url + "/#/")
    expect(page.locator("#conn")).to_have_text(re.compile("live"))
    page.evaluate("window.__sameDocument = true")
    node = "xid-node-1"
    now = time.time()
    # An agent's batch over the real ingest route, from a node of its own so that the
    # simulated node's health is untouched.
    cluster.api(
        "ingest",
        {
            "node": node,
            "agent_id": uuid.uuid4().hex[:16],
            "seq": 1,
            "sent_at": now,
            "simulated": True,
            "gpus": [{"uuid": "GPU-xid-test-0", "index": 0, "name": "test GPU"}],
            "events": [
                {
                    "kind": "xid",
                    "ts": now,
                    "gpu_uuid": "GPU-xid-test-0",
                    "xid": 79,
                    "message": "GPU has fallen off the bus",
                }
            ],
        },
    )
    item = page.locator('.events li[data-kind="xid"]').first
    expect(item).to_contain_text("XID 79")
    expect(item).to_contain_text(node)
    expect(item).to_contain_text("GPU has fallen off the bus")
    assert page.evaluate("window.__sameDocument") is True


def test_an_empty_cluster_says_no_nodes_have_reported(
    page: Page, empty_server: Cluster, screenshot: Screenshot
) -> None:
    page.add_init_script(f"sessionStorage.setItem('trainguard.token', {empty_server.token!r})")
    page.goto(empty_server.url + "/")
    expect(page.get_by_text("No nodes have reported yet.")).to_be_visible()
    expect(page.get_by_text("No events yet.")).to_be_visible()
    page.goto(empty_server.url + "/#/nodes/never-seen")
    expect(page.locator(".facts")).to_contain_text('Node "never-seen" has not reported')
    screenshot(page, "node-unknown")
    page.goto(empty_server.url + "/#/")
    expect(page.get_by_text("No nodes have reported yet.")).to_be_visible()
    expect(page.get_by_text("No job has reported yet.")).to_be_visible()
    expect(page.get_by_text("No open incidents.")).to_be_visible()
    screenshot(page, "overview-empty")
    # Every view says honestly that there is nothing (yet), from a plain load.
    page.get_by_role("link", name="Jobs", exact=True).click()
    expect(page.get_by_text("No job has reported yet.")).to_be_visible()
    expect(page.locator('#nav a[href="#/jobs"]')).to_have_attribute("aria-current", "page")
    page.goto(empty_server.url + "/#/jobs/never-ran")
    expect(page.locator(".facts")).to_contain_text('Job "never-ran" has not reported')
    expect(page.get_by_role("button", name="Restart…")).to_be_disabled()
    page.goto(empty_server.url + "/#/incidents")
    expect(page.get_by_text("No incidents yet.")).to_be_visible()
    expect(page.get_by_text("No recommendation is waiting.")).to_be_visible()
    page.goto(empty_server.url + "/#/incidents/999")
    expect(page.get_by_text("There is no incident #999.")).to_be_visible()
    page.goto(empty_server.url + "/#/no/such/page")
    expect(page.get_by_role("heading", name="Page not found")).to_be_visible()


def test_the_connection_indicator_shows_a_dropped_stream_and_its_return(
    page: Page, empty_server: Cluster, screenshot: Screenshot
) -> None:
    page.add_init_script(
        f"sessionStorage.setItem('trainguard.token', {json.dumps(empty_server.token)})"
    )
    page.goto(empty_server.url + "/")
    conn = page.locator("#conn")
    expect(conn).to_have_attribute("data-state", "live")
    expect(conn).to_have_text(re.compile("live"))

    empty_server.kill_server()
    expect(conn).to_have_attribute("data-state", "reconnecting")
    expect(conn).to_have_text(re.compile("reconnecting"))
    screenshot(page, "overview-reconnecting")

    empty_server.start_server()  # same port, same database
    expect(conn).to_have_attribute("data-state", "live")
