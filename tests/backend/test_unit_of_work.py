"""A 2xx means stored: the request's transaction commits before the response is sent
(FastAPI runs a yield dependency's exit after the response unless its scope is
"function"), so a failed commit is an error to the client, never a lost change."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import uvicorn
from sqlalchemy import event

from tests.support import AUTH, TOKEN, free_port, wait_for
from trainguard.backend.app import create_app
from trainguard.backend.settings import Settings


def test_the_commit_happens_before_the_response(db_url: str, tmp_path: Path) -> None:
    app = create_app(Settings(database_url=db_url, admin_token=TOKEN, data_dir=tmp_path))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(base), 30)
        committed: list[float] = []
        sessions = app.state.sessions

        def after_commit(_s: object) -> None:
            committed.append(time.monotonic())

        event.listen(sessions, "after_commit", after_commit)
        batch = b'{"node":"n1","agent_id":"agent-n1-0001","seq":1,"sent_at":%f}' % time.time()
        r = httpx.post(f"{base}/api/v1/ingest", content=batch, headers=AUTH, timeout=10)
        assert r.status_code == 200, r.text
        r = httpx.post(
            f"{base}/api/v1/nodes/n1/cordon", json={"reason": "check"}, headers=AUTH, timeout=10
        )
        answered = time.monotonic()
        assert r.status_code == 200, r.text
        assert committed and committed[-1] <= answered
        # The change is visible to the very next request.
        assert httpx.get(f"{base}/api/v1/nodes/n1", headers=AUTH).json()["cordoned"] is True
    finally:
        server.should_exit = True
        thread.join(10)


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
