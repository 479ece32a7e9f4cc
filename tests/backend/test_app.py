"""App-level plumbing: the access log never shows the stream's access token."""

from __future__ import annotations

import logging

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
