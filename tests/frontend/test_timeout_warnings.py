"""The job page's timeout warnings (docs/restarts.md, "Timeout hierarchy"), in a real
browser against a real server: hidden while the reported timeouts are in order, shown with
the fix once a checkpoint save grows past the collective timeout, and in the job's feed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.frontend.conftest import Cluster, JobFeed
from tests.frontend.seed import JobSeed
from trainguard.sdk.timeouts import launcher_timeouts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

# An ft_launcher 0.4.1 line (its --ft-param-* spellings), as /proc/<pid>/cmdline has it.
FT_041 = ["/usr/bin/python3", "/opt/venv/bin/ft_launcher", "--nnodes", "1",
          "--nproc-per-node", "2", "--max-restarts", "3",
          "--ft-param-initial_rank_heartbeat_timeout", "600",
          "--ft-param-rank_heartbeat_timeout", "300", "train.py"]  # fmt: skip
WAIT_MS = 30_000  # the analytics pass runs every 5 s; the page reads the job on its event


def test_the_job_page_warns_of_timeouts_in_the_wrong_order_with_the_fix(
    signed_in: Page, cluster: Cluster, screenshot: Callable[[Page, str], Path]
) -> None:
    name = "timeouts-job"
    rank = {**launcher_timeouts(FT_041, {}), "collective_s": 600.0, "hang_s": 20.0}
    seed = JobSeed(
        name,
        ["timeouts-node-1"],
        ranks_per_node=2,
        steps=20,
        slow_rank=None,
        in_process=True,
        launcher="ft_launcher",
        timeouts={**rank, "checkpoint_save_s": 120.0, "first_step_s": 120.0},
    )
    feed = JobFeed(cluster, seed, step=20)
    feed.start()
    try:
        cluster.wait(lambda: cluster.api(f"jobs/{name}")["ranks"], "the job never reported")
        page = signed_in
        page.goto(f"{cluster.url}/#/jobs/{name}")
        launchers = page.locator("#capabilities [data-field='launchers']")
        expect(launchers).to_contain_text("ft_launcher")
        panel = page.locator("#timeout-warnings")
        expect(panel).to_be_hidden()  # in order: no warning
        seed.timeouts = {**seed.timeouts, "checkpoint_save_s": 650.0}  # a save grew
        expect(panel).to_be_visible(timeout=WAIT_MS)
        expect(panel.locator("li")).to_have_count(2)
        first = panel.locator('li[data-code="collective_over_checkpoint"]')
        expect(first).to_contain_text("The longest checkpoint save (650 s)")
        expect(first).to_contain_text("process group's timeout (600 s)")
        expect(first).to_contain_text("Fix: Raise init_process_group(timeout=...)")
        second = panel.locator('li[data-code="launcher_heartbeat_over_checkpoint"]')
        expect(second).to_contain_text("rank heartbeat timeout (300 s)")
        expect(second).to_contain_text("--ft-rank-heartbeat-timeout")
        feed_rows = page.locator("ol.events li", has_text="timeout hierarchy")
        expect(feed_rows).to_have_count(2, timeout=WAIT_MS)
        expect(page.locator("[data-field='levels']")).to_have_attribute(
            "data-levels", "in_process,launcher"
        )  # a warning blocks nothing
        screenshot(page, "job-timeout-warnings")
    finally:
        feed.stop()
