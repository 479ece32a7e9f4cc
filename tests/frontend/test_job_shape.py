"""The job's shape in a real browser against a real server (docs/engine.md, "The job's
shape"): a job trains on two nodes, two more nodes' agents list a launcher of it waiting
as a hot spare (one on a node an operator cordoned: listed with why, not counted); an XID
79 makes the engine exclude one training node. The job page names the nodes training, the
spares and the excluded node with its incident; the overview counts one spare."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.frontend.conftest import Cluster, JobFeed, start_server
from tests.frontend.seed import JobSeed, agent_id, xid_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

JOB = "shape-job"
ACTIVE = ["shape-node-1", "shape-node-2"]
READY, CORDONED = "shape-node-3", "shape-node-4"
WAIT_MS = 20_000


class LauncherFeed:
    """What the agents of these nodes send every second: their launchers of the job."""

    def __init__(self, cluster: Cluster, states: dict[str, str]) -> None:
        self.cluster, self.states = cluster, states
        self.ids = {node: agent_id() for node in states}
        self.seq = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="launcher-feed", daemon=True)

    def post(self) -> None:
        self.seq += 1
        for pid, (node, state) in enumerate(self.states.items(), start=4000):
            ranks = 2 if state == "active" else 0
            launcher = {"job": JOB, "pid": pid, "state": state, "launcher": "torchrun",
                        "min_nodes": 2, "max_nodes": 2, "ranks": ranks}  # fmt: skip
            body = {"node": node, "agent_id": self.ids[node], "seq": self.seq,
                    "sent_at": time.time(), "launchers": [launcher]}  # fmt: skip
            self.cluster.api("ingest", body)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.post()
            except OSError:  # the server is stopping
                return

    def __enter__(self) -> LauncherFeed:
        self.post()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture(scope="module")
def shaped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    data = tmp_path_factory.mktemp("shape")
    cluster = start_server(data)
    seed = JobSeed(JOB, ACTIVE, ranks_per_node=2, steps=30, slow_rank=None, launcher="torchrun")
    feed = JobFeed(cluster, seed, step=30)
    states = {ACTIVE[0]: "active", ACTIVE[1]: "active", READY: "spare", CORDONED: "spare"}
    try:
        feed.start()
        with LauncherFeed(cluster, states):
            cluster.wait(lambda: cluster.api(f"jobs/{JOB}")["world_size"] == 4, "no job")
            cluster.api("ingest", xid_batch(ACTIVE[1], 79, time.time(), "GPU fell off the bus"))
            cluster.wait(
                lambda: cluster.api(f"jobs/{JOB}")["shape"]["excluded"], "nothing excluded"
            )
            cluster.api(f"nodes/{CORDONED}/cordon", {"reason": "bad HBM"})
            cluster.wait(lambda: cluster.node(CORDONED)["cordoned"], "no operator cordon")
            yield cluster
    finally:
        feed.stop()
        cluster.stop()


@pytest.fixture
def page_in(page: Page, shaped: Cluster) -> Page:
    page.add_init_script(f"sessionStorage.setItem('trainguard.token', {json.dumps(shaped.token)})")
    return page


def test_the_job_page_shows_the_nodes_training_the_spares_and_the_excluded_node(
    page_in: Page, shaped: Cluster, screenshot: Callable[[Page, str], Path]
) -> None:
    page = page_in
    page.goto(f"{shaped.url}/#/jobs/{JOB}")
    panel = page.locator("#shape")
    expect(panel.locator("[data-field='active']")).to_contain_text(
        "2: shape-node-1, shape-node-2", timeout=WAIT_MS
    )
    spares = panel.locator("[data-field='spares']")
    expect(spares).to_have_attribute("data-capacity", "1")
    expect(spares).to_contain_text("1 ready")
    expect(spares.locator(f"[data-spare='{READY}']")).to_have_attribute("data-available", "true")
    cordoned = spares.locator(f"[data-spare='{CORDONED}']")
    expect(cordoned).to_have_attribute("data-available", "false")
    expect(cordoned).to_contain_text("not counted: node cordoned")
    excluded = panel.locator(f"[data-field='excluded'] [data-excluded='{ACTIVE[1]}']")
    expect(excluded).to_contain_text("incident")
    expect(panel.locator("[data-field='nnodes']")).to_have_text("2 (--nnodes 2)")
    screenshot(page, "job-shape")


def test_the_overview_counts_the_spares_that_could_join(
    page_in: Page, shaped: Cluster, screenshot: Callable[[Page, str], Path]
) -> None:
    page = page_in
    page.goto(f"{shaped.url}/#/")
    cell = page.locator(f"tr[data-job='{JOB}'] td.col-spares")
    expect(cell).to_have_text("1", timeout=WAIT_MS)
    expect(page.locator("th", has_text="Spares")).to_be_visible()
    screenshot(page, "overview-spares")
