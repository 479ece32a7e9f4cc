"""What a token may do decides what the dashboard offers: signed in with a viewer token
(GET /whoami says its roles), the job page and the node page show no action buttons; an
operator token still gets Restart... and Cordon.... The server checks every action anyway
(tests/security/test_roles.py)."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from tests.frontend.conftest import JOB, SIM_NODE, Cluster, JobFeed
from trainguard.backend.tokens import service

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

ACTIONS = re.compile(r"^(Restart|Cordon|Readmit|Approve|Reject)\u2026$")


def _token(cluster: Cluster, role: str) -> str:
    engine = create_engine(f"sqlite:///{cluster.data_dir / 'trainguard.db'}")
    with Session(engine) as session:
        token = service.create(session, role, f"ui-{role}", None).token
        session.commit()
    engine.dispose()
    return token


def _sign_in(page: Page, token: str) -> Page:
    page.add_init_script(f"sessionStorage.setItem('trainguard.token', {json.dumps(token)})")
    return page


def test_a_viewer_sees_no_action_buttons(page: Page, cluster: Cluster, job_feed: JobFeed) -> None:
    page = _sign_in(page, _token(cluster, "viewer"))
    page.goto(f"{cluster.url}/#/jobs/{JOB}")
    expect(page.locator("body")).to_have_attribute("data-role", "viewer")
    expect(page.locator('#capabilities [data-field="levels"]')).to_have_attribute(
        "data-levels", "in_process,launcher"
    )
    expect(page.get_by_role("button", name=ACTIONS)).to_have_count(0)
    expect(page.locator("#restart-job")).to_have_count(0)

    page.goto(f"{cluster.url}/#/nodes/{SIM_NODE}")
    expect(page.locator("#gpu-chart-memory .uplot canvas")).to_have_count(1)
    expect(page.get_by_role("button", name=ACTIONS)).to_have_count(0)


def test_an_operator_still_gets_restart_and_cordon(
    page: Page, cluster: Cluster, job_feed: JobFeed
) -> None:
    page = _sign_in(page, _token(cluster, "operator"))
    page.goto(f"{cluster.url}/#/jobs/{JOB}")
    expect(page.locator("body")).to_have_attribute("data-role", "operator")
    expect(page.get_by_role("button", name="Restart\u2026")).to_be_visible()

    page.goto(f"{cluster.url}/#/nodes/{SIM_NODE}")
    expect(page.get_by_role("button", name="Cordon\u2026")).to_be_visible()
