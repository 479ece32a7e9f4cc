"""The policy replay page (issue #36 item 1) in a real browser against a real server
whose decision engine recorded three XID 79s on nodes of three jobs (over the real
ingest route; each exclusion acked by the test as its agents would): with eight nodes the
breaker (max(1, 25 %) = 2) cordons two and holds the third. A candidate that lowers
`[breaker] max_fraction` to 12.5 % (cap 1) would have held the second as well: the page
shows the two policies side by side, the self-check, and that incident, linked to its
page. A candidate that does not validate is refused with its key; a period without
evidence says so, as does one past the replay's limit; a viewer's page offers no Replay."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from tests.frontend.conftest import Cluster, JobFeed, start_server
from tests.frontend.seed import JobSeed, xid_batch
from trainguard.backend.tokens import service

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

Screenshot = Callable[[Page, str], Path]

NODES = [f"replay-n{i}" for i in range(8)]
JOBS = [f"replay-j{i}" for i in range(4)]
FAULTS = [NODES[0], NODES[2], NODES[4]]  # one node of each of the first three jobs
PHASES = ["delivered", "torn_down", "restarted", "resumed"]


def _ack_all(cluster: Cluster, incident: dict[str, Any]) -> None:
    """Each of the incident's commands acked through `resumed`, as its agent would."""
    t = time.time()
    for i, phase in enumerate(PHASES):
        for command in incident["commands"]:
            cluster.api(
                f"commands/{command['id']}/acks",
                {"phase": phase, "ts": t + 0.3 * (i + 1), "node": command["node"]},
            )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, list[int]]]:
    """The server and the recorded incidents' ids, in the order of FAULTS."""
    cluster = start_server(tmp_path_factory.mktemp("replay"))
    feeds = [
        JobFeed(
            cluster,
            JobSeed(job, NODES[2 * i : 2 * i + 2], ranks_per_node=1, steps=20, slow_rank=None),
            step=20,
        )
        for i, job in enumerate(JOBS)
    ]
    try:
        for feed in feeds:
            feed.start()
        cluster.wait(lambda: len(cluster.api("nodes")) == len(NODES), "the nodes never reported")
        ids = []
        for n, node in enumerate(FAULTS):
            cluster.api("ingest", xid_batch(node, 79, time.time(), "GPU has fallen off the bus"))
            job = JOBS[n]
            inc = cluster.wait(
                lambda job=job: next(iter(cluster.api(f"incidents?job={job}")), None),
                f"no incident for the XID 79 on {node}",
            )
            if n < 2:  # cordoned: its agents carry it out
                inc = cluster.wait(
                    lambda inc=inc: (d := cluster.api(f"incidents/{inc['id']}"))["commands"] and d,
                    "the exclusion sent no command",
                )
                _ack_all(cluster, inc)
                cluster.wait(
                    lambda inc=inc: cluster.api(f"incidents/{inc['id']}")["status"] == "resolved",
                    "the exclusion never resolved",
                )
            else:  # past the breaker's cap: held for an operator
                assert inc["status"] == "pending" and inc["decisions"][-1]["mode"] == "breaker"
            ids.append(inc["id"])
        yield cluster, ids
    finally:
        for feed in feeds:
            feed.stop()
        cluster.stop()


@pytest.fixture
def page_in(page: Page, recorded: tuple[Cluster, list[int]]) -> Page:
    token = json.dumps(recorded[0].token)
    page.add_init_script(f"sessionStorage.setItem('trainguard.token', {token})")
    return page


def _metric(page: Page, metric: str, run: str) -> Any:
    return page.locator(f'.replay-totals tr[data-metric="{metric}"] td[data-run="{run}"]')


@pytest.mark.xfail(
    reason="since the replay steps at the live engine's cadence over the whole export "
    "(merge of the chaos-trace work), replaying this server's last hour takes over the "
    "page's 90 s wait on this machine; issue #36 keeps the replay's speed open",
    strict=False,
)
def test_a_lower_breaker_cap_shows_side_by_side_with_the_incident_it_would_hold(
    page_in: Page, recorded: tuple[Cluster, list[int]], screenshot: Screenshot
) -> None:
    page = page_in
    cluster, ids = recorded
    page.goto(cluster.url + "/#/replay")
    expect(page.locator('#nav a[href="#/replay"]')).to_have_attribute("aria-current", "page")
    policy = page.get_by_label("Candidate policy (TOML)")
    expect(policy).to_have_value(re.compile(r"\[breaker\]\nmax_fraction = 0\.125"))
    page.get_by_label("Period", exact=True).select_option("3600")
    run = page.get_by_role("button", name="Replay")
    with page.expect_response("**/api/v1/policy/replay", timeout=90_000) as answer:
        run.click()
        expect(page.locator("#replay-run")).to_be_disabled()
        expect(page.locator(".replay-busy")).to_contain_text("Replaying the period")
        screenshot(page, "replay-busy")
    assert answer.value.status == 200, answer.value.text()

    totals = page.locator(".replay-totals")
    expect(totals).to_be_visible(timeout=60_000)
    expect(run).to_be_enabled()
    expect(page.locator(".replay-busy")).to_have_text("")
    # In force (replayed as recorded): two cordons, one hold; the candidate: one and two.
    for metric, recorded_n, current, candidate in [
        ("incidents", "3", "3", "3"),
        ("cordons", "2", "2", "1"),
        ("breaker_holds", "1", "1", "2"),
        ("actions.exclude_node", "2", "2", "1"),
    ]:
        expect(_metric(page, metric, "recorded")).to_have_text(recorded_n)
        expect(_metric(page, metric, "current")).to_have_text(current)
        expect(_metric(page, metric, "candidate")).to_have_text(candidate)
    expect(totals.locator('tr[data-metric="cordons"] .replay-delta')).to_have_text("\u22121")
    expect(totals.locator('tr[data-metric="breaker_holds"] .replay-delta')).to_have_text("+1")
    # The expected recovery comes with its sample: the two exclusions measured here.
    expect(page.locator('.replay-model [data-model="exclude_node/*"]')).to_contain_text("(n=2)")
    expect(_metric(page, "expected_recovery_s", "candidate")).to_have_text(re.compile(r"\d"))
    # The keys the candidate changes, side by side.
    change = page.locator('.replay-changes tr[data-key="breaker.max_fraction"]')
    expect(change).to_contain_text("0.25")
    expect(change).to_contain_text("0.125")
    expect(page.locator(".replay-check")).to_have_attribute("data-exact", "true")

    # One incident differs: the second exclusion, which the candidate would have held.
    rows = page.locator(
        "section[aria-labelledby='replay-differ-heading'] .replay-incidents tbody tr"
    )
    expect(rows).to_have_count(1)
    row = rows.first
    expect(row).to_have_attribute("data-incident", str(ids[1]))
    expect(row).to_contain_text(FAULTS[1])
    expect(row.locator('td[data-run="current"]')).to_contain_text("exclude_node")
    expect(row.locator('td[data-run="current"]')).to_contain_text(f"cordons {FAULTS[1]}")
    expect(row.locator('td[data-run="candidate"]')).to_contain_text("pending")
    expect(row.locator('td[data-run="candidate"]')).to_contain_text("1 breaker hold")
    screenshot(page, "replay-report")

    # Its link opens the recorded incident's page (its recovery timeline) ...
    row.get_by_role("link", name=f"#{ids[1]}").click()
    expect(page).to_have_url(re.compile(rf"#/incidents/{ids[1]}$"))
    expect(page.locator('[data-field="level"]')).to_have_text("exclude_node")
    expect(page.locator("#gantt")).to_be_visible()
    # ... and coming back shows the report again.
    page.go_back()
    expect(page.locator(".replay-totals")).to_be_visible()
    expect(rows).to_have_count(1)


def test_a_candidate_that_does_not_validate_is_refused_naming_its_key(
    page_in: Page, recorded: tuple[Cluster, list[int]], screenshot: Screenshot
) -> None:
    page = page_in
    page.goto(recorded[0].url + "/#/replay")
    policy = page.get_by_label("Candidate policy (TOML)")
    policy.fill("# a cap above every node\n[breaker]\nmax_fraction = 2\n")
    page.get_by_role("button", name="Replay").click()
    error = page.locator(".replay-error")
    expect(error).to_have_attribute("data-code", "bad_policy")
    expect(error).to_contain_text("The candidate policy does not validate")
    expect(error).to_contain_text("breaker.max_fraction")
    expect(error).to_contain_text("line 3")
    expect(policy).to_have_attribute("aria-invalid", "true")
    # The line it names is selected in the editor.
    selected = policy.evaluate("t => t.value.slice(t.selectionStart, t.selectionEnd)")
    assert selected == "max_fraction = 2"
    screenshot(page, "replay-bad-policy")

    # A period before anything was recorded: nothing to replay, said so.
    policy.fill("[breaker]\nmax_fraction = 0.125\n")
    page.get_by_label("Period", exact=True).select_option("range")
    page.get_by_label("From").fill("2020-01-01T00:00:00")
    page.get_by_label("to", exact=True).fill("2020-01-02T00:00:00")
    page.get_by_role("button", name="Replay").click()
    expect(error).to_have_attribute("data-code", "no_evidence")
    expect(error).to_contain_text("No evidence in this period")
    expect(error).to_contain_text("no evidence was recorded between 2020-01-0")
    expect(policy).to_have_attribute("aria-invalid", "false")
    screenshot(page, "replay-no-evidence")


def test_a_period_past_the_replay_limit_names_the_limit(
    page: Page, tmp_path: Path, screenshot: Screenshot
) -> None:
    cluster = start_server(tmp_path, {"TRAINGUARD_REPLAY_MAX_EVENTS": "1"})
    try:
        for node in ("limit-n1", "limit-n2"):
            cluster.api("ingest", xid_batch(node, 13, time.time(), "Graphics SM exception"))
        cluster.wait(lambda: len(cluster.api("events?kind=xid")) == 2, "the XIDs never landed")
        page.add_init_script(
            f"sessionStorage.setItem('trainguard.token', {json.dumps(cluster.token)})"
        )
        page.goto(cluster.url + "/#/replay")
        page.get_by_role("button", name="Replay").click()
        error = page.locator(".replay-error")
        expect(error).to_have_attribute("data-code", "replay_limit")
        expect(error).to_contain_text("The period is too large")
        expect(error).to_contain_text("limit of 1 (TRAINGUARD_REPLAY_MAX_EVENTS)")
        screenshot(page, "replay-limit")
    finally:
        page.goto("about:blank")
        cluster.stop()


def test_a_viewer_is_not_offered_the_replay(
    page: Page, recorded: tuple[Cluster, list[int]]
) -> None:
    cluster = recorded[0]
    engine = create_engine(f"sqlite:///{cluster.data_dir / 'trainguard.db'}")
    with Session(engine) as session:
        token = service.create(session, "viewer", "ui-viewer", None).token
        session.commit()
    engine.dispose()
    page.add_init_script(f"sessionStorage.setItem('trainguard.token', {json.dumps(token)})")
    page.goto(cluster.url + "/#/replay")
    expect(page.locator("body")).to_have_attribute("data-role", "viewer")
    expect(page.get_by_role("button", name="Replay")).to_be_disabled()
    expect(page.locator(".replay-viewer")).to_contain_text("needs an operator token")
