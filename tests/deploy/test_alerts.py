"""Alert webhooks against a real HTTP receiver on a free loopback port: generic JSON and
Slack bodies, retries on 5xx with Retry-After, no retry on other 4xx, timeouts, one slow
webhook delaying no other, and the alerts file's one-line errors."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support import wait_for
from trainguard.backend.alerts.config import AlertsConfigError, Webhook, load_webhooks
from trainguard.backend.alerts.dispatcher import AlertDispatcher, kinds_for_change

INCIDENT = {
    "id": 12,
    "job": "llama-405b",
    "status": "open",
    "level": "exclude_node",
    "cause": "xid_79",
    "trigger": "auto",
    "node": "gpu-017",
    "xid": 79,
    "gpu_uuid": "GPU-1",
    "lost_steps": 40,
    "recovery_s": None,
    "timeline": {"fault_at": 1.0},
    "evidence": [{"kind": "xid"}],  # not in the generic body
}


class Receiver:
    """Answers each path with the scripted statuses (then 200), records every request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self.script: dict[str, list[tuple[int, dict[str, str]]]] = {}
        self.delay: dict[str, float] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver.lock:
                    receiver.requests.append((self.path, dict(self.headers), body))
                    steps = receiver.script.get(self.path) or []
                    status, headers = steps.pop(0) if steps else (200, {})
                time.sleep(receiver.delay.get(self.path, 0.0))
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and went away: what the test wants

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def paths(self) -> list[str]:
        with self.lock:
            return [p for p, _, _ in self.requests]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def hook(receiver: Receiver, name: str, **kw: Any) -> Webhook:
    return Webhook(name=name, url=f"{receiver.url}/{name}", **kw)


def test_generic_and_slack_bodies_for_an_opened_incident(receiver: Receiver) -> None:
    alerts = AlertDispatcher(
        [
            hook(receiver, "generic", headers={"Authorization": "Bearer s3cret"}),
            hook(receiver, "slack", format="slack", events=("incident_opened", "stop_job")),
        ],
        public_url="https://trainguard.example/",
    )
    alerts.start()
    try:
        assert alerts.emit("incident_opened", INCIDENT) == 2
        assert alerts.emit("incident_resolved", {**INCIDENT, "status": "resolved"}) == 1
        wait_for(lambda: len(receiver.requests) == 3)
    finally:
        alerts.stop()
    by_path = {}
    for path, headers, body in receiver.requests:
        by_path.setdefault(path, []).append((headers, body))
    (g_headers, g), (_, resolved) = by_path["/generic"]
    assert g_headers["Authorization"] == "Bearer s3cret"
    assert g["kind"] == "incident_opened" and g["version"] == 1 and g["source"] == "trainguard"
    assert g["url"] == "https://trainguard.example/#/incidents/12"
    assert g["incident"]["node"] == "gpu-017" and "evidence" not in g["incident"]
    assert g["summary"] == (
        "incident #12 on job llama-405b opened: xid_79 -> exclude_node (node gpu-017, XID 79)"
    )
    assert resolved["kind"] == "incident_resolved"
    ((_, s),) = by_path["/slack"]
    assert s["text"].startswith(":rotating_light: incident #12 on job llama-405b opened")
    assert s["blocks"][0] == {"type": "section", "text": {"type": "mrkdwn", "text": s["text"]}}
    assert "<https://trainguard.example/#/incidents/12|open in trainguard>" in json.dumps(s)
    assert alerts.stats[("generic", "incident_opened", "sent")] == 1
    assert alerts.stats[("slack", "incident_opened", "sent")] == 1


def test_5xx_and_429_are_retried_honouring_retry_after_other_4xx_are_not(
    receiver: Receiver,
) -> None:
    waits: list[float] = []
    alerts = AlertDispatcher(
        [hook(receiver, "flaky", retries=3), hook(receiver, "refuses", retries=3)],
        sleep=waits.append,
    )
    receiver.script["/flaky"] = [(503, {}), (429, {"Retry-After": "2"}), (200, {})]
    receiver.script["/refuses"] = [(400, {})]
    ok = alerts.deliver(alerts.webhooks[0], "stop_job", {"x": 1}, 12)
    bad = alerts.deliver(alerts.webhooks[1], "stop_job", {"x": 1}, 12)
    assert (ok.ok, ok.attempts, ok.status) == (True, 3, 200)
    assert waits[1] >= 2.0  # Retry-After
    assert (bad.ok, bad.attempts, bad.status) == (False, 1, 400)
    assert bad.error.startswith("HTTP 400")
    assert alerts.stats[("refuses", "stop_job", "failed")] == 1


def test_a_webhook_that_times_out_gives_up_and_delays_no_other(receiver: Receiver) -> None:
    receiver.delay["/slow"] = 1.0
    alerts = AlertDispatcher(
        [hook(receiver, "slow", timeout_s=0.2, retries=1), hook(receiver, "fast")],
        sleep=lambda s: None,
    )
    alerts.start()
    try:
        alerts.emit("escalation", INCIDENT)
        wait_for(lambda: "/fast" in receiver.paths(), timeout=5)
        assert alerts.stats[("slow", "escalation", "failed")] == 0  # still trying
        wait_for(lambda: alerts.stats[("slow", "escalation", "failed")] == 1, timeout=10)
    finally:
        alerts.stop(timeout=2)
    (slow,) = [d for d in alerts.recent if d.webhook == "slow"]
    assert slow.attempts == 2 and slow.status is None and "timed out after 0.2 s" in slow.error


def test_unreachable_receiver_fails_after_the_retries() -> None:
    alerts = AlertDispatcher(
        [Webhook(name="gone", url="http://127.0.0.1:9/x", retries=2)], sleep=lambda s: None
    )
    d = alerts.deliver(alerts.webhooks[0], "incident_opened", {}, 1)
    assert (d.ok, d.attempts, d.status) == (False, 3, None)
    assert "ConnectError" in d.error


def test_status_changes_map_to_alert_kinds() -> None:
    assert kinds_for_change(None, {"status": "open"}) == ["incident_opened"]
    assert kinds_for_change(None, {"status": "pending"}) == ["incident_opened", "needs_approval"]
    # The breaker held an exclusion: an operator must approve it.
    assert kinds_for_change("open", {"status": "pending"}) == ["needs_approval"]
    assert kinds_for_change("pending", {"status": "pending"}) == []
    assert kinds_for_change("open", {"status": "open"}, waiting=True) == ["job_waiting"]
    assert kinds_for_change("open", {"status": "open"}, escalated=True) == ["escalation"]
    assert kinds_for_change("open", {"status": "stopped"}, escalated=True) == [
        "escalation",
        "stop_job",
    ]
    assert kinds_for_change("open", {"status": "resolved"}) == ["incident_resolved"]
    assert kinds_for_change("open", {"status": "failed"}) == ["incident_failed"]
    assert kinds_for_change("resolved", {"status": "resolved"}) == []


def test_the_example_alerts_file_loads_and_bad_files_say_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "alerts.example.toml"
    monkeypatch.setenv("TRAINGUARD_SLACK_WEBHOOK_URL", "https://hooks.slack.com/services/T/B/x")
    hooks = load_webhooks(example)
    assert {h.format for h in hooks} == {"json", "slack"}
    slack = next(h for h in hooks if h.format == "slack")
    assert slack.url.endswith("/T/B/x") and slack.where == "https://hooks.slack.com"
    assert "T/B/x" not in repr(slack)

    def err(text: str) -> str:
        p = tmp_path / "alerts.toml"
        p.write_text(text)
        with pytest.raises(AlertsConfigError) as exc:
            load_webhooks(p)
        return str(exc.value)

    assert "webhook a: url must be an http:// or https:// URL" in err(
        '[[webhook]]\nname = "a"\nurl = "ftp://x"\n'
    )
    assert "webhook b: events.0:" in err(
        '[[webhook]]\nname = "b"\nurl = "http://x"\nevents = ["incident_open"]\n'
    )
    assert "webhook c: timeout_s:" in err(
        '[[webhook]]\nname = "c"\nurl = "http://x"\ntimeout_s = 0\n'
    )
    assert "url_env: environment variable NOPE_NOT_SET is not set" in err(
        '[[webhook]]\nname = "d"\nurl_env = "NOPE_NOT_SET"\n'
    )
    assert "unknown key 'hooks'" in err("[[hooks]]\nname = 'x'\n")
    assert "name used twice" in err(
        '[[webhook]]\nname = "e"\nurl = "http://x"\n[[webhook]]\nname = "e"\nurl = "http://y"\n'
    )
    assert load_webhooks(None) == []
