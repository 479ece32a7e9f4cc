"""Shadow rules on the incident page, in a real browser against a real server (issue #36
item 3): the policy file marks the RESTART_APP bucket's rule `shadow = true` with the
action `launcher`; an XID 13 on a node of a job under NVRx's Wrapper makes the rule in
force act (in_process) and the page lists what the shadow rule would have done beside
the real decisions."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.frontend.conftest import Cluster, JobFeed, start_server
from tests.frontend.seed import JobSeed, xid_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

JOB = "shadow-job"
NODES = ["shadow-node-1", "shadow-node-2"]
POLICY = '[xid.buckets]\nRESTART_APP = { action = "launcher", shadow = true }\n'


@pytest.fixture(scope="module")
def shadowed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, int]]:
    data = tmp_path_factory.mktemp("shadow")
    policy = data / "policy.toml"
    policy.write_text(POLICY)
    cluster = start_server(data, {"TRAINGUARD_POLICY_FILE": str(policy)})
    seed = JobSeed(JOB, NODES, ranks_per_node=2, steps=20, slow_rank=None, in_process=True)
    feed = JobFeed(cluster, seed, step=20)
    try:
        feed.start()
        cluster.wait(lambda: cluster.api(f"jobs/{JOB}")["world_size"] == 4, "no job")
        cluster.api("ingest", xid_batch(NODES[0], 13, time.time(), "Graphics SM exception"))
        inc = cluster.wait(
            lambda: next(iter(cluster.api(f"incidents?job={JOB}")), None), "no incident"
        )
        yield cluster, inc["id"]
    finally:
        feed.stop()
        cluster.stop()


def test_the_incident_page_shows_the_shadow_rule_beside_the_real_decision(
    page: Page, shadowed: tuple[Cluster, int], screenshot: Callable[[Page, str], Path]
) -> None:
    cluster, incident = shadowed
    detail = cluster.api(f"incidents/{incident}")
    assert detail["level"] == "in_process"  # the rule in force acted, not the shadow one
    page.add_init_script(f"sessionStorage.setItem('trainguard.token', {json.dumps(cluster.token)})")
    page.goto(f"{cluster.url}/#/incidents/{incident}")
    shadow = page.locator("ol.shadow-decisions li")
    expect(shadow).to_have_count(1, timeout=20_000)
    expect(shadow).to_contain_text("would have done launcher instead of in_process")
    expect(shadow.locator("code")).to_have_text("xid.buckets.RESTART_APP")
    expect(page.locator("ol.decisions:not(.shadow-decisions) li").first).to_contain_text(
        "in_process"
    )
    screenshot(page, "incident-shadow-rule")
