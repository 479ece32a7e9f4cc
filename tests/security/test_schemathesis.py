"""Schemathesis against the OpenAPI document: for every route, a bounded number of
generated requests (valid and invalid) to a real `trainguard server` over HTTP. No answer
may be a 5xx, every documented answer must match its schema, and invalid input must be
refused with a 4xx. Derandomized: the same examples on every run."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import AUTH, TOKEN, free_port, wait_for

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is a dev dependency")

from hypothesis import HealthCheck, settings  # noqa: E402 - after importorskip (installed with schemathesis)
from schemathesis.checks import not_a_server_error  # noqa: E402 - after importorskip
from schemathesis.specs.openapi.checks import (  # noqa: E402 - after importorskip
    negative_data_rejection,
    response_schema_conformance,
)

from trainguard.backend.app import create_app  # noqa: E402 - after importorskip
from trainguard.backend.settings import Settings  # noqa: E402 - after importorskip

pytestmark = pytest.mark.slow

EXAMPLES_PER_ROUTE = 15
# The document the server serves is built by the same code, without a database.
schema = schemathesis.openapi.from_dict(
    create_app(Settings(database_url="sqlite://", admin_token=TOKEN)).openapi()
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("schemathesis")
    port = free_port()
    log = tmp / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainguard.agent.cli", "server", "--port", str(port)],
            env={
                **os.environ,
                "TRAINGUARD_ADMIN_TOKEN": TOKEN,
                "TRAINGUARD_DATA_DIR": str(tmp),
                "TRAINGUARD_COMMAND_WAIT_MAX_S": "0.2",  # long polls answer at once
            },
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(ready, 60, 0.2)
    yield url
    proc.terminate()
    proc.wait(15)
    assert "Traceback" not in _tail(log), _tail(log)


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-6000:]


@schema.exclude(path="/api/v1/stream").parametrize()  # a stream never ends: test_roles.py
@settings(
    max_examples=EXAMPLES_PER_ROUTE,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_the_api_matches_its_schema_and_never_fails(case: object, server: str) -> None:
    case.call_and_validate(  # type: ignore[attr-defined]  # schemathesis passes a Case
        base_url=server,
        headers=AUTH,
        timeout=30,
        checks=[not_a_server_error, response_schema_conformance, negative_data_rejection],
    )
