"""Every role boundary through the real API: each route of the OpenAPI document, called
with each kind of credential, on SQLite and PostgreSQL.

The table below is the access policy (docs/security.md). A route missing from it fails
`test_every_route_has_a_declared_role`, so a new route cannot ship without a decision.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.security.conftest import Tokens, batch, bearer
from tests.support import TOKEN

# (method, path) -> the role a caller needs; "open" needs no token, "token" any valid one.
POLICY: dict[tuple[str, str], str] = {
    ("POST", "/api/v1/ingest"): "agent",
    ("GET", "/api/v1/agents/{node}/commands"): "agent",
    ("POST", "/api/v1/commands/{command_id}/acks"): "agent",
    ("GET", "/api/v1/nodes"): "viewer",
    ("GET", "/api/v1/nodes/{node}"): "viewer",
    ("GET", "/api/v1/nodes/{node}/gpus"): "viewer",
    ("GET", "/api/v1/nodes/{node}/cordons"): "viewer",
    ("GET", "/api/v1/gpus/{uuid}/samples"): "viewer",
    ("GET", "/api/v1/events"): "viewer",
    ("GET", "/api/v1/jobs"): "viewer",
    ("GET", "/api/v1/jobs/{job}"): "viewer",
    ("GET", "/api/v1/jobs/{job}/steps"): "viewer",
    ("GET", "/api/v1/incidents"): "viewer",
    ("GET", "/api/v1/incidents/{incident_id}"): "viewer",
    ("GET", "/api/v1/engine"): "viewer",
    ("GET", "/api/v1/stream"): "viewer",
    ("GET", "/api/v1/jobs/{job}/stragglers"): "viewer",
    ("GET", "/api/v1/nodes/{node}/stragglers"): "viewer",
    ("GET", "/api/v1/jobs/{job}/goodput"): "viewer",
    ("GET", "/api/v1/jobs/{job}/advice"): "viewer",
    ("POST", "/api/v1/advice/whatif"): "viewer",  # a calculation; changes nothing
    ("GET", "/api/v1/xids"): "viewer",
    ("GET", "/api/v1/whoami"): "token",
    ("GET", "/metrics"): "viewer",
    ("POST", "/api/v1/nodes/{node}/cordon"): "operator",
    ("POST", "/api/v1/nodes/{node}/uncordon"): "operator",
    ("POST", "/api/v1/jobs/{job}/restarts"): "operator",
    ("POST", "/api/v1/jobs/{job}/launch-failures"): "operator",
    ("POST", "/api/v1/incidents/{incident_id}/approve"): "operator",
    ("POST", "/api/v1/policy/replay"): "operator",
    ("POST", "/api/v1/incidents/{incident_id}/reject"): "operator",
    ("GET", "/healthz"): "open",
    ("GET", "/readyz"): "open",
}
# FastAPI's own pages: the API's shape is public (it is in the source), no data is.
# /docs and /redoc are off (their pages load scripts from a CDN); the document stays.
DOC_PAGES = {"/openapi.json"}

PARAMS = {
    "{node}": "n1",
    "{job}": "job-1",
    "{uuid}": "GPU-n1-0",
    "{incident_id}": "1",
    "{command_id}": "c0ffee",
}


def _request(method: str, template: str) -> tuple[str, dict[str, Any]]:
    """A well-formed request for a route, so that only auth can refuse it."""
    path = template
    for k, v in PARAMS.items():
        path = path.replace(k, v)
    kw: dict[str, Any] = {}
    now = time.time()
    if template == "/api/v1/ingest":
        kw["content"] = batch("n1", seq=int(now * 1000))
    elif template.endswith("/acks"):
        kw["json"] = {"phase": "delivered", "ts": now, "node": "n1"}
    elif template.endswith("/restarts"):
        kw["json"] = {"level": "launcher", "reason": "probe"}
    elif template.endswith(("/cordon", "/uncordon", "/approve", "/reject", "/launch-failures")):
        kw["json"] = {"reason": "probe"}
    elif template.endswith("/whatif"):
        kw["json"] = {"gpus": 8, "checkpoint_cost_s": 10, "restart_s": {"launcher": 60}}
    elif template.endswith("/commands"):
        kw["params"] = {"wait": 0}
    return path, kw


def _grants(tokens: Tokens) -> dict[str, tuple[dict[str, str], set[str]]]:
    """Each credential: its headers and the roles it holds."""
    return {
        "none": ({}, set()),
        "unknown token": (bearer("tg_" + "x" * 43), set()),
        "agent n1": (bearer(tokens.agent_n1), {"agent"}),
        "viewer": (bearer(tokens.viewer), {"viewer"}),
        "operator": (bearer(tokens.operator), {"viewer", "operator"}),
        "admin": (bearer(TOKEN), {"agent", "viewer", "operator"}),
    }


def test_every_route_has_a_declared_role(client: Any) -> None:
    doc = client.get("/openapi.json").json()
    routes = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert routes == set(POLICY), (
        f"undeclared: {sorted(routes - set(POLICY))}; gone: {sorted(set(POLICY) - routes)}"
    )


def test_each_credential_reaches_exactly_the_routes_of_its_roles(
    client: Any, tokens: Tokens
) -> None:
    client.headers.pop("Authorization")
    # Something to act on: node n1 with a live rank of job-1 (so a restart is possible).
    ranks = [{"job": "job-1", "rank": 0, "pid": 4242, "world_size": 1}]
    r = client.post("/api/v1/ingest", content=batch("n1", ranks=ranks), headers=bearer(TOKEN))
    assert r.status_code == 200, r.text
    failures = []
    for who, (headers, roles) in _grants(tokens).items():
        for (method, template), need in POLICY.items():
            allowed = need == "open" or need in roles or (need == "token" and bool(roles))
            if template == "/api/v1/stream" and allowed:
                continue  # an open stream never ends: test_the_live_stream_needs_a_viewer
            path, kw = _request(method, template)
            r = client.request(method, path, headers=headers, **kw)
            if r.status_code >= 500:
                failures.append(f"{who}: {method} {path} -> {r.status_code} {r.text[:200]}")
            elif allowed and r.status_code in (401, 403):
                failures.append(f"{who}: {method} {path} refused ({r.status_code} {r.text})")
            elif not allowed:
                want = 401 if not roles else 403
                if r.status_code != want or not r.json().get("detail"):
                    failures.append(f"{who}: {method} {path} -> {r.status_code}, want {want}")
    assert failures == []


def test_refusals_say_why(client: Any, tokens: Tokens) -> None:
    client.headers.pop("Authorization")
    r = client.get("/api/v1/nodes")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["detail"] == "missing bearer token (Authorization: Bearer <token>)"
    r = client.get("/api/v1/nodes", headers=bearer("tg_not-a-token"))
    assert r.status_code == 401 and r.json()["detail"] == "invalid or revoked token"
    r = client.get("/api/v1/nodes", headers=bearer("x" * 513))
    assert r.status_code == 401 and r.json()["detail"] == "invalid token"
    r = client.get("/api/v1/nodes", headers={"Authorization": f"Basic {tokens.viewer}"})
    assert r.status_code == 401  # only the Bearer scheme
    r = client.post("/api/v1/nodes/n1/cordon", json={"reason": "x"}, headers=bearer(tokens.viewer))
    assert r.status_code == 403 and r.json()["detail"] == "this token lacks the operator role"


def test_the_live_stream_needs_a_viewer_and_alone_takes_a_query_token(
    live_url: str, tokens: Tokens
) -> None:
    def first_line(**params: str) -> tuple[int, str]:
        with httpx.stream("GET", f"{live_url}/api/v1/stream", params=params, timeout=10) as r:
            return r.status_code, next(r.iter_lines()) if r.status_code == 200 else r.read()

    assert first_line(access_token=tokens.viewer, topics="nodes") == (200, "event: hello")
    assert first_line(access_token=tokens.operator, topics="nodes")[0] == 200
    assert first_line(access_token=tokens.agent_n1, topics="nodes")[0] == 403
    assert first_line(access_token="tg_wrong", topics="nodes")[0] == 401
    assert first_line(topics="nodes")[0] == 401
    r = httpx.get(f"{live_url}/api/v1/nodes", params={"access_token": tokens.viewer})
    assert r.status_code == 401


def test_an_agent_acts_only_for_its_own_node(client: Any, tokens: Tokens, db_url: str) -> None:
    client.headers.pop("Authorization")
    agent = bearer(tokens.agent_n1)
    r = client.post("/api/v1/ingest", content=batch("n2"), headers=agent)
    assert r.status_code == 403 and r.json()["detail"] == "this token is bound to node 'n1'"
    assert client.get("/api/v1/nodes", headers=bearer(TOKEN)).json() == []  # nothing stored
    assert client.post("/api/v1/ingest", content=batch("n1"), headers=agent).status_code == 200
    r = client.get("/api/v1/agents/n2/commands", params={"wait": 0}, headers=agent)
    assert r.status_code == 403

    # A restart of a job with ranks on both nodes: one command per node.
    ranks = {n: [{"job": "job-1", "rank": i, "pid": 100 + i}] for i, n in enumerate(("n1", "n2"))}
    for node, rk in ranks.items():
        tok = tokens.agent_n1 if node == "n1" else tokens.agent_n2
        r = client.post("/api/v1/ingest", content=batch(node, seq=2, ranks=rk), headers=bearer(tok))
        assert r.status_code == 200, r.text
    r = client.post(
        "/api/v1/jobs/job-1/restarts",
        json={"level": "launcher", "reason": "test"},
        headers=bearer(tokens.operator),
    )
    assert r.status_code == 202, r.text
    mine = client.get("/api/v1/agents/n1/commands", params={"wait": 0}, headers=agent).json()
    theirs = client.get(
        "/api/v1/agents/n2/commands", params={"wait": 0}, headers=bearer(tokens.agent_n2)
    ).json()
    assert [c["node"] for c in mine] == ["n1"] and [c["node"] for c in theirs] == ["n2"]

    # n1's token cannot ack n2's command, whatever node it claims.
    ack = {"phase": "delivered", "ts": time.time()}
    url = f"/api/v1/commands/{theirs[0]['id']}/acks"
    r = client.post(url, json={**ack, "node": "n2"}, headers=agent)
    assert r.status_code == 403
    r = client.post(url, json={**ack, "node": "n1"}, headers=agent)
    assert r.status_code == 409 and "not addressed to node 'n1'" in r.json()["detail"]
    # Still pending for n2: nothing was recorded.
    theirs_after = client.get(
        "/api/v1/agents/n2/commands", params={"wait": 0}, headers=bearer(tokens.agent_n2)
    ).json()
    assert [c["id"] for c in theirs_after] == [theirs[0]["id"]]
    assert client.get("/api/v1/incidents", headers=agent).status_code == 403  # nor read


def test_cors_is_closed_by_default(client: Any) -> None:
    """No CORS middleware: a cross-origin page gets no allow-origin, so a browser will not
    let another site's script read the API with a token it stole or a user's session."""
    preflight = client.options(
        "/api/v1/nodes/n1/cordon",
        headers={
            "Origin": "https://evil.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code in (401, 403, 404, 405)
    assert not any(h.lower().startswith("access-control-") for h in preflight.headers)
    simple = client.get("/api/v1/nodes", headers={"Origin": "https://evil.example"})
    assert simple.status_code == 200
    assert "access-control-allow-origin" not in simple.headers


@pytest.mark.parametrize("path", ["/", "/index.html", "/healthz", "/readyz"])
def test_only_the_ui_and_the_probes_are_open(client: Any, path: str) -> None:
    client.headers.pop("Authorization")
    r = client.get(path)
    assert r.status_code == 200
    if path == "/readyz":
        assert r.json() == {"status": "ready"}  # no detail about the database when it is up


def test_the_docs_pages_are_the_only_other_open_routes(client: Any) -> None:
    client.headers.pop("Authorization")
    for path in sorted(DOC_PAGES):
        assert client.get(path).status_code == 200
    for path in ("/docs", "/redoc"):  # no CDN-loaded pages: the static UI answers 404
        assert client.get(path).status_code == 404


def test_whoami_says_each_tokens_roles(client: Any, tokens: Tokens) -> None:
    client.headers.pop("Authorization")
    for who, (headers, roles) in _grants(tokens).items():
        r = client.get("/api/v1/whoami", headers=headers)
        if not roles:
            assert r.status_code == 401, (who, r.text)
            continue
        assert r.status_code == 200, (who, r.text)
        me = r.json()
        assert me["roles"] == sorted(roles), who
        assert me["node"] == ("n1" if who == "agent n1" else None), who
    me = client.get("/api/v1/whoami", headers=bearer(tokens.viewer)).json()
    assert me == {"name": "viewer:alice", "roles": ["viewer"], "node": None}
