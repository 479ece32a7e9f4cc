"""App-level plumbing: the access log never shows the stream's access token; another
method on an API path answers that route's 405 and `Allow`, not the static UI's; every
route with a body documents the 400 of a body that cannot be parsed."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import trainguard.backend.app  # noqa: F401 - installs the filter on uvicorn's access logger


def test_access_log_redacts_the_stream_token(caplog: object) -> None:
    log = logging.getLogger("uvicorn.access")
    record = log.makeRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "GET", "/api/v1/stream?topics=nodes&access_token=s3cret-token", "1.1", 200),
        None,
    )
    for f in log.filters:
        f.filter(record)
    line = record.getMessage()
    assert "s3cret-token" not in line
    assert "access_token=<redacted>" in line and "topics=nodes" in line


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("OPTIONS", "/api/v1/ingest", "POST"),
        ("GET", "/api/v1/nodes/n1/cordon", "POST"),
        ("DELETE", "/api/v1/jobs/j1/restarts", "POST"),
        ("PUT", "/api/v1/nodes", "GET"),
        ("OPTIONS", "/healthz", "GET"),
    ],
)
def test_another_method_gets_the_routes_allow_header(
    client: Any, method: str, path: str, allow: str
) -> None:
    r = client.request(method, path)
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == allow
    assert r.json() == {"detail": "Method Not Allowed"}


def test_the_ui_is_still_served_beneath_the_routes(client: Any) -> None:
    assert "<!doctype html>" in client.get("/").text.lower()
    assert client.get("/app.js").status_code == 200
    assert client.get("/api/v1/no-such-route").status_code == 404


def test_a_body_that_is_not_text_is_a_documented_400(client: Any) -> None:
    r = client.post(
        "/api/v1/nodes/n1/cordon",
        content=b"\xff\xfe\x00",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400 and "detail" in r.json()
    doc = client.get("/openapi.json").json()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if "requestBody" in op:
                assert "400" in op["responses"], (method, path)
