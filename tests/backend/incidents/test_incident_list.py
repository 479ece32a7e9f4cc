"""GET /api/v1/incidents: filters (job, node, status, level, since), keyset pages by id
whose cursors travel in the Link / X-Next-Cursor / X-Prev-Cursor headers, and the 422s
for values the list does not know."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from trainguard.backend.incidents.listing import Cursor
from trainguard.backend.models import Incident, Job, Node
from trainguard.backend.models.control import ACTION_NAMES, INCIDENT_STATUSES

T0 = 1_800_000_000.0
URL = "/api/v1/incidents"
JOBS = ("job-a", "job-b")
NODES = ("node-1", "node-2", "node-3")
Insert = Callable[[int], list[int]]


@pytest.fixture
def client(make_client: Callable[..., Any]) -> Any:
    # No engine: it would act on the open incidents these tests write themselves.
    return make_client(engine_enabled=False)


@pytest.fixture
def insert(client: Any, db_url: str) -> Iterator[Insert]:
    """insert(n): n more incidents, cycling through jobs, nodes (or none), statuses and
    levels, created a second apart; returns their ids."""
    engine = create_engine(db_url)
    with Session(engine) as s:
        for name in JOBS:
            s.add(Job(name=name, first_seen=T0, last_seen=T0))
        for name in NODES:
            s.add(Node(name=name, first_seen=T0, last_seen=T0))
        s.commit()
    count = itertools.count()

    def add(n: int) -> list[int]:
        with Session(engine) as s:
            jobs = {name: id_ for name, id_ in s.execute(select(Job.name, Job.id))}
            nodes = {name: id_ for name, id_ in s.execute(select(Node.name, Node.id))}
            rows = []
            for _ in range(n):
                k = next(count)
                node = (*NODES, None)[k % 4]
                rows.append(
                    Incident(
                        job_id=jobs[JOBS[k % 2]],
                        node_id=nodes[node] if node else None,
                        created_at=T0 + k,
                        trigger="auto",
                        triggered_by="engine",
                        cause="xid",
                        level=ACTION_NAMES[k % 3],
                        status=INCIDENT_STATUSES[k % 5],
                    )
                )
            s.add_all(rows)
            s.commit()
            return [r.id for r in rows]

    yield add
    engine.dispose()


def ids(answer: Any) -> list[int]:
    assert answer.status_code == 200, answer.text
    return [i["id"] for i in answer.json()]


def test_without_parameters_the_list_is_the_newest_incidents_as_before(
    client: Any, insert: Insert
) -> None:
    made = insert(5)
    r = client.get(URL)
    assert ids(r) == made[::-1]
    first = r.json()[0]
    # The fault's node, for the list's node column (none for a job-wide fault).
    assert (first["node"], first["job"], first["status"]) == ("node-1", "job-a", "rejected")
    assert r.json()[1]["node"] is None
    # One page holds them all: no link either way.
    assert "link" not in r.headers and "x-next-cursor" not in r.headers
    assert "x-prev-cursor" not in r.headers


def test_each_filter_narrows_the_list(client: Any, insert: Insert) -> None:
    insert(40)
    every = client.get(URL).json()
    assert len(every) == 40

    def check(params: dict[str, Any], keep: Callable[[dict[str, Any]], bool]) -> None:
        want = [i["id"] for i in every if keep(i)]
        assert want, params  # each filter leaves some rows and drops others
        assert len(want) < 40, params
        assert ids(client.get(URL, params=params)) == want, params

    check({"job": "job-b"}, lambda i: i["job"] == "job-b")
    check({"node": "node-2"}, lambda i: i["node"] == "node-2")
    check({"status": "failed"}, lambda i: i["status"] == "failed")
    check({"level": "exclude_node"}, lambda i: i["level"] == "exclude_node")
    check({"since": T0 + 30}, lambda i: i["created_at"] >= T0 + 30)
    check(
        {"job": "job-a", "node": "node-1", "level": "in_process", "since": T0 + 10},
        lambda i: (
            (i["job"], i["node"], i["level"]) == ("job-a", "node-1", "in_process")
            and i["created_at"] >= T0 + 10
        ),
    )
    # Names nobody reported match nothing (they are not an error).
    assert ids(client.get(URL, params={"node": "nowhere"})) == []
    assert ids(client.get(URL, params={"job": "never-ran"})) == []
    # A status and a level that exist but no incident has.
    assert ids(client.get(URL, params={"status": "stopped"})) == []
    assert ids(client.get(URL, params={"level": "reset_gpu"})) == []


def next_params(r: Any, rel: str) -> dict[str, str] | None:
    """The query of the Link header's `rel` URL (a relative reference: ?query)."""
    link = r.links.get(rel)
    if link is None:
        return None
    parts = urlsplit(link["url"])
    assert parts.path == "" and not parts.netloc, link  # resolves against the request URL
    return {k: v[-1] for k, v in parse_qs(parts.query).items()}


def test_pages_walk_every_row_once_while_incidents_arrive(client: Any, insert: Insert) -> None:
    first = insert(23)
    seen: list[int] = []
    params: dict[str, Any] | None = {"limit": 5}
    pages = 0
    while params is not None:
        r = client.get(URL, params=params)
        page = ids(r)
        assert 0 < len(page) <= 5 and page == sorted(page, reverse=True)
        seen += page
        pages += 1
        assert (r.headers.get("x-prev-cursor") is None) == (pages == 1)
        if r.headers.get("x-next-cursor"):
            assert next_params(r, "next") == {"limit": "5", "cursor": r.headers["x-next-cursor"]}
        insert(3)  # newer incidents: on the first page only, never shifting a later one
        params = next_params(r, "next")
    assert pages == 5
    assert seen == first[::-1]  # each once, newest first, none of those inserted meanwhile


def test_prev_pages_lead_back_to_the_newest_with_filters_kept(client: Any, insert: Insert) -> None:
    insert(60)
    query = {"job": "job-a", "status": "open", "limit": "2"}  # every 10th: 6 rows
    wanted = ids(client.get(URL, params={"job": "job-a", "status": "open"}))
    assert len(wanted) == 6
    r1 = client.get(URL, params=query)
    r2 = client.get(URL, params=next_params(r1, "next"))
    r3 = client.get(URL, params=next_params(r2, "next"))
    assert ids(r1) + ids(r2) + ids(r3) == wanted
    assert next_params(r3, "next") is None and "x-next-cursor" not in r3.headers
    back = next_params(r3, "prev")
    assert back is not None and {k: back[k] for k in query} == query
    assert ids(client.get(URL, params=back)) == ids(r2)
    top = client.get(URL, params=next_params(r2, "prev"))
    assert ids(top) == ids(r1) and next_params(top, "prev") is None  # the newest end
    assert next_params(top, "next") == next_params(r1, "next")


def test_a_page_past_either_end_is_empty_and_leads_back(client: Any, insert: Insert) -> None:
    made = insert(4)
    past_old = client.get(URL, params={"cursor": Cursor("older", made[0]).encode(), "limit": 1})
    assert ids(past_old) == [] and "x-next-cursor" not in past_old.headers
    assert ids(client.get(URL, params=next_params(past_old, "prev"))) == [made[0]]  # the oldest
    past_new = client.get(URL, params={"cursor": Cursor("newer", made[-1]).encode()})
    assert ids(past_new) == [] and "x-prev-cursor" not in past_new.headers
    assert ids(client.get(URL, params=next_params(past_new, "next"))) == made[::-1]


def test_unknown_filter_values_and_bad_cursors_answer_422(client: Any, insert: Insert) -> None:
    insert(2)
    r = client.get(URL, params={"status": "exploded"})
    assert r.status_code == 422
    assert all(f"'{s}'" in r.json()["detail"] for s in INCIDENT_STATUSES), r.text
    r = client.get(URL, params={"level": "reboot"})
    assert r.status_code == 422
    assert all(f"'{a}'" in r.json()["detail"] for a in ACTION_NAMES), r.text
    good = Cursor("older", 5).encode()
    for bad in ["nonsense!", "bzp4", good[:-1] + "!", "eDoxMg", Cursor("older", 2**40).encode()]:
        r = client.get(URL, params={"cursor": bad})
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["detail"].startswith("query.cursor: "), r.text
        assert r.json()["errors"][0]["loc"] == ["query", "cursor"]
    assert client.get(URL, params={"cursor": "x" * 65}).status_code == 422
    for params in [{"limit": 0}, {"limit": 1001}, {"since": -1}, {"node": "n" * 129}]:
        assert client.get(URL, params=params).status_code == 422, params
    assert client.get(URL, params={"cursor": good}).status_code == 200


def test_the_openapi_document_declares_the_filters_and_the_page_headers(client: Any) -> None:
    op = client.get("/openapi.json").json()["paths"][URL]["get"]
    params = {p["name"]: p for p in op["parameters"]}
    assert {"job", "node", "status", "level", "since", "cursor", "limit"} <= set(params)
    assert set(op["responses"]["200"]["headers"]) == {"Link", "X-Next-Cursor", "X-Prev-Cursor"}
    assert op["responses"]["200"]["content"]["application/json"]["schema"]["type"] == "array"
