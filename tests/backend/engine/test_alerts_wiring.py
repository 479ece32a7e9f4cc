"""Alert webhooks as the backend runs them: the engine's incident opens and the agent's
acks resolving it each reach a real HTTP receiver once."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

from tests.support import wait_for
from trainguard.protocol import wire


class Receiver:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers["Content-Length"])
                outer.bodies.append(json.loads(self.rfile.read(n)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    def kinds(self) -> list[str]:
        return [b["kind"] for b in self.bodies]


def test_engine_incidents_and_acks_reach_the_webhook(make_client: Any, tmp_path: Path) -> None:
    rx = Receiver()
    alerts = tmp_path / "alerts.toml"
    alerts.write_text(f'[[webhook]]\nname = "test"\nformat = "json"\nurl = "{rx.url}"\n')
    client = make_client(alerts_file=alerts)
    now = time.time()
    ranks = [wire.RankStatus(job="job-a", rank=r, pid=100 + r, world_size=2) for r in (0, 1)]
    batch = wire.Batch(node="n1", agent_id="agent-n1", seq=1, sent_at=now, ranks=ranks)
    assert client.post("/api/v1/ingest", content=wire.encode(batch)).status_code == 200
    fault = wire.Batch(
        node="n1",
        agent_id="agent-n1",
        seq=2,
        sent_at=now,
        ranks=ranks,
        events=[wire.Event(kind="exception", ts=now, job="job-a", rank=1, message="boom")],
    )
    assert client.post("/api/v1/ingest", content=wire.encode(fault)).status_code == 200
    wait_for(lambda: "incident_opened" in rx.kinds(), 20)
    opened = next(b for b in rx.bodies if b["kind"] == "incident_opened")
    assert opened["incident"]["job"] == "job-a"
    cmd = wait_for(lambda: client.get("/api/v1/agents/n1/commands?wait=0").json(), 20)[0]
    for phase in ("delivered", "torn_down", "restarted", "resumed"):
        r = client.post(
            f"/api/v1/commands/{cmd['id']}/acks",
            json={"phase": phase, "ts": time.time(), "node": "n1"},
        )
        assert r.status_code == 200
    wait_for(lambda: "incident_resolved" in rx.kinds(), 20)
    rx.server.shutdown()
    assert rx.kinds().count("incident_opened") == 1
    assert rx.kinds().count("incident_resolved") == 1
