"""The incident list in a real browser against a real server: a node column, filters
reflected in the hash (a linkable view), and Older / Newer pages that stay put while new
incidents arrive (those appear on the first page only)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from tests.frontend.conftest import Cluster, start_server
from trainguard.backend.models import Incident, Job, Node

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

T0 = 1_800_000_000.0
NODES = ("gpu-node-1", "gpu-node-2")
CLOSED = ("resolved", "failed", "stopped", "rejected")  # nothing for an engine to act on


@pytest.fixture
def server(tmp_path: Path, page: Page) -> Iterator[Cluster]:
    cluster = start_server(tmp_path, {"TRAINGUARD_ENGINE_ENABLED": "false"})
    yield cluster
    page.goto("about:blank")  # an open live stream holds up the server's exit
    cluster.stop()


def seeder(cluster: Cluster) -> Callable[[int], list[int]]:
    """add(n): n incidents on the server's database, two of three on NODES[0]."""
    engine = create_engine(f"sqlite:///{cluster.data_dir / 'trainguard.db'}")
    with Session(engine) as s:
        s.add_all([Job(name=n, first_seen=T0, last_seen=T0) for n in ("job-a", "job-b")])
        s.add_all([Node(name=n, first_seen=T0, last_seen=T0) for n in NODES])
        s.commit()
    made = 0

    def add(n: int) -> list[int]:
        nonlocal made
        with Session(engine) as s:
            jobs = {name: id_ for name, id_ in s.execute(select(Job.name, Job.id))}
            nodes = {name: id_ for name, id_ in s.execute(select(Node.name, Node.id))}
            rows = []
            for k in range(made, made + n):
                rows.append(
                    Incident(
                        job_id=jobs["job-a" if k % 2 else "job-b"],
                        node_id=nodes[NODES[0] if k % 3 else NODES[1]],
                        created_at=T0 + 30 * k,
                        trigger="auto",
                        triggered_by="engine",
                        cause="xid",
                        level="launcher",
                        status=CLOSED[k % 4],
                    )
                )
            s.add_all(rows)
            s.commit()
            made += n
            return [r.id for r in rows]

    return add


def row_ids(page: Page) -> list[int]:
    return [
        int(v)
        for v in page.locator(".incidents-table tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.incident)"
        )
    ]


def test_incidents_filter_by_node_and_page_while_new_ones_arrive(
    page: Page, server: Cluster, screenshot: Callable[[Page, str], Path]
) -> None:
    add = seeder(server)
    add(111)  # a demo hour's worth
    on_node = [i["id"] for i in server.api(f"incidents?node={NODES[0]}&limit=1000")]
    assert len(on_node) == 74
    page.add_init_script(f"sessionStorage.setItem('trainguard.token', {json.dumps(server.token)})")
    page.goto(server.url + "/#/incidents")
    rows = page.locator(".incidents-table tbody tr")
    expect(rows).to_have_count(50)
    expect(page.locator(".incidents-table thead")).to_contain_text("Node")
    newer, older = (
        page.get_by_role("button", name="Newer"),
        page.get_by_role("button", name="Older"),
    )
    expect(newer).to_be_disabled()
    expect(older).to_be_enabled()

    # Filter by node: typed (the server's node names are offered), applied on change.
    page.get_by_label("Node").fill(NODES[0])
    page.get_by_label("Node").press("Enter")
    expect(page).to_have_url(re.compile(rf"#/incidents\?node={NODES[0]}$"))
    expect(page.locator(f'.incidents-table tr[data-node="{NODES[0]}"]')).to_have_count(50)
    expect(rows).to_have_count(50)
    first = row_ids(page)
    assert first == on_node[:50]

    older.click()
    expect(rows).to_have_count(24)
    expect(page).to_have_url(re.compile(rf"node={NODES[0]}&cursor=\w+$"))
    expect(older).to_be_disabled()
    expect(newer).to_be_enabled()
    second = row_ids(page)
    assert first + second == on_node  # every row once, newest first
    assert set(page.locator("td.incident-node").all_inner_texts()) == {NODES[0]}
    page.evaluate("scrollTo(0, 0)")  # the sticky top bar at the top, not across the rows
    screenshot(page, "incidents-filtered")

    # New incidents arrive: a later page holds the same rows, also from its link.
    _, new_id = add(2)  # the second on NODES[0]
    page.reload()
    expect(rows).to_have_count(24)
    assert row_ids(page) == second
    expect(page.get_by_label("Node")).to_have_value(NODES[0])

    # Newer: the rows just above, as they were; the new incident is newer still.
    newer.click()
    expect(rows.first).to_have_attribute("data-incident", str(first[0]))
    assert row_ids(page) == first
    expect(newer).to_be_enabled()
    # At the newest end the view is the first page again, which live updates fill.
    newer.click()
    expect(page).to_have_url(re.compile(rf"#/incidents\?node={NODES[0]}$"))
    expect(rows.first).to_have_attribute("data-incident", str(new_id))
    assert row_ids(page) == [new_id, *first[:49]]
    expect(newer).to_be_disabled()

    # Another filter joins the node's; the page starts from the newest again.
    page.get_by_label("Status").select_option("failed")
    expect(page).to_have_url(re.compile(rf"node={NODES[0]}&status=failed$"))
    expect(rows.first).to_have_attribute("data-status", "failed")
    assert set(rows.evaluate_all("rows => rows.map(r => r.dataset.status)")) == {"failed"}
    page.get_by_label("Node").fill("nowhere")
    page.get_by_label("Node").press("Enter")
    expect(page.get_by_text("No incidents match these filters.")).to_be_visible()
