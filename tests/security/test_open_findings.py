"""Findings of the security tests, fixed: a bad stream topic is refused before the stream
opens, an out-of-range incident id is a 4xx, the documented 422 is the one sent, and no
request body refers to a definition the OpenAPI document lacks."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.security.conftest import Tokens


def test_a_bad_stream_topic_is_refused_before_the_stream_opens(
    live_url: str, tokens: Tokens
) -> None:
    params = {"access_token": tokens.viewer, "topics": "not a topic"}
    with httpx.stream("GET", f"{live_url}/api/v1/stream", params=params, timeout=10) as r:
        assert r.status_code == 422


def test_an_incident_id_beyond_the_column_is_a_4xx(client: Any) -> None:
    assert client.get(f"/api/v1/incidents/{2**70}").status_code == 422


def test_the_documented_422_is_the_422_sent(client: Any) -> None:
    r = client.post("/api/v1/nodes/n1/cordon", json={"reason": 1})
    assert r.status_code == 422 and isinstance(r.json()["detail"], str)
    doc = client.get("/openapi.json").json()
    detail = doc["components"]["schemas"]["HTTPValidationError"]["properties"]["detail"]
    assert detail.get("type") == "string"


def test_no_request_body_refers_to_a_missing_definition(client: Any) -> None:
    assert '"#/$defs/' not in json.dumps(client.get("/openapi.json").json())
