"""GET /api/v1/xids: the agent's XID catalog, served to the dashboard."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.support import AUTH, TOKEN
from trainguard.backend.app import create_app
from trainguard.backend.settings import Settings
from trainguard.protocol.xid import XID_CATALOG


@pytest.fixture
def sqlite_client(tmp_path: Path) -> Iterator[TestClient]:
    # The catalog reads no table: one database is enough.
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'tg.db'}", admin_token=TOKEN, data_dir=tmp_path
    )
    with TestClient(create_app(settings)) as client:
        yield client


def test_the_catalog_lists_every_xid_with_meaning_and_action(sqlite_client: TestClient) -> None:
    r = sqlite_client.get("/api/v1/xids", headers=AUTH)
    assert r.status_code == 200
    body = r.json()
    by_code = {e["xid"]: e for e in body["xids"]}
    assert set(by_code) == set(XID_CATALOG)
    assert by_code[79]["meaning"] == "GPU has fallen off the bus"
    assert by_code[79]["action"] == "RESTART_BM"
    assert by_code[79]["action_text"].startswith("reboot the node")
    assert all(e["action_text"] for e in body["xids"])
    assert body["unknown"]["action"] == "UNKNOWN"
    assert [e["xid"] for e in body["xids"]] == sorted(by_code)


def test_the_catalog_needs_a_token(sqlite_client: TestClient) -> None:
    assert sqlite_client.get("/api/v1/xids").status_code == 401
