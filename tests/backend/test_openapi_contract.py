"""The OpenAPI document is a contract: every success answer has a schema, every route that
takes a token or input documents its 401 / 422 with the app's one error body, and
/metrics is Prometheus text. The checker runs on the app's document and, to show it can
fail, on a small app with one route of each kind of gap."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import pytest
from fastapi import FastAPI, Query, Response

from tests.support import TOKEN
from trainguard.backend.app import create_app
from trainguard.backend.settings import Settings

# Routes that answer without a token.
PUBLIC = {"/healthz", "/readyz"}
ERROR_REF = "#/components/schemas/ErrorBody"
METHODS = {"get", "post", "put", "patch", "delete"}


def _has_schema(response: dict[str, Any]) -> bool:
    content = response.get("content") or {}
    # `itemSchema`: a stream's events (OpenAPI 3.2, as FastAPI writes text/event-stream).
    return any(("schema" in m and m["schema"] != {}) or "itemSchema" in m for m in content.values())


def _is_error_body(response: dict[str, Any]) -> bool:
    schema = (response.get("content") or {}).get("application/json", {}).get("schema", {})
    return schema.get("$ref") in {ERROR_REF, "#/components/schemas/HTTPValidationError"}


def problems(doc: dict[str, Any], pending: Collection[tuple[str, str]] = ()) -> list[str]:
    """What the document leaves out, one line per gap."""
    out: list[str] = []
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method not in METHODS or (method, path) in pending:
                continue
            where = f"{method.upper()} {path}"
            responses: dict[str, Any] = op.get("responses", {})
            ok = {code: r for code, r in responses.items() if code.startswith("2")}
            if not ok:
                out.append(f"{where}: no 2xx response")
            for code, r in ok.items():
                if code != "204" and not _has_schema(r):
                    out.append(f"{where}: {code} without a schema")
                if code == "204" and r.get("content"):
                    out.append(f"{where}: 204 with a body")
            takes_input = bool(op.get("parameters") or op.get("requestBody"))
            needed = (["401"] if path not in PUBLIC else []) + (["422"] if takes_input else [])
            for code in needed:
                if code not in responses:
                    out.append(f"{where}: {code} not documented")
                elif not _is_error_body(responses[code]):
                    out.append(f"{where}: {code} is not the error body")
            for code, r in responses.items():
                if code[0] in "45" and not _is_error_body(r) and path not in PUBLIC:
                    out.append(f"{where}: {code} is not the error body")
    return out


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return create_app(Settings(database_url="sqlite://", admin_token=TOKEN)).openapi()


def test_every_route_documents_its_answers_and_errors(doc: dict[str, Any]) -> None:
    assert problems(doc) == []


def test_the_error_body_is_the_one_the_handlers_send(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    for name in ("ErrorBody", "HTTPValidationError"):
        assert schemas[name]["required"] == ["detail"]
        assert schemas[name]["properties"]["detail"]["type"] == "string"
    assert "ValidationError" not in schemas


def test_metrics_is_documented_as_prometheus_text(doc: dict[str, Any]) -> None:
    ok = doc["paths"]["/metrics"]["get"]["responses"]["200"]
    assert list(ok["content"]) == ["text/plain"]
    assert ok["content"]["text/plain"]["schema"] == {"type": "string"}


def test_handler_bounds_are_in_the_schema(doc: dict[str, Any]) -> None:
    params = {p["name"]: p["schema"] for p in doc["paths"]["/api/v1/events"]["get"]["parameters"]}
    assert (params["limit"]["minimum"], params["limit"]["maximum"]) == (1, 1000)
    batch = doc["paths"]["/api/v1/ingest"]["post"]["requestBody"]["content"]["application/json"]
    assert "7 days before" in batch["schema"]["properties"]["sent_at"]["description"]


def test_the_checker_finds_each_kind_of_gap() -> None:
    planted = FastAPI()

    @planted.get("/api/v1/untyped")
    def untyped(limit: int = Query(1)) -> Response:  # no schema, no 401
        return Response(b"")

    @planted.get("/api/v1/typed", responses={401: {"description": "no token"}})
    def typed() -> dict[str, int]:  # a schema, but a 401 that is not the error body
        return {}

    found = problems(planted.openapi())
    assert "GET /api/v1/untyped: 200 without a schema" in found
    assert "GET /api/v1/untyped: 401 not documented" in found
    assert "GET /api/v1/typed: 401 is not the error body" in found
    # FastAPI's own 422 (HTTPValidationError) passes: create_app gives it the error body.
    assert not any("untyped: 422" in p for p in found)
