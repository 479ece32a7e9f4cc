"""SIGTERM to `trainguard server` while agents long-poll for commands and a browser holds a
live stream: the polls are answered 503 + Retry-After (the agent's "poll again"), the
stream ends, the server exits 0 at once, and neither side logs a traceback or an error."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.reliability.harness import ADMIN, Agent, Backend, Procs, agent_tokens, batches_stored
from tests.support import free_port, wait_for
from trainguard.backend import db

pytestmark = pytest.mark.slow


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except Exception as exc:
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_sigterm_answers_long_polls_with_retry_and_exits_cleanly(
    procs: Procs, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    url = f"sqlite:///{data / 'trainguard.db'}"
    db.upgrade(url)
    tokens = agent_tokens(url, ["stop-a", "stop-b"])
    port = free_port()
    backend = Backend(procs, port, {"TRAINGUARD_DATA_DIR": str(data)}).start()
    agent = Agent(procs, "stop-a", tokens["stop-a"], port).start()
    wait_for(lambda: batches_stored(url).get("stop-a", 0) > 0, 60)

    def long_poll() -> httpx.Response:
        return httpx.get(
            f"{backend.url}/api/v1/agents/stop-b/commands",
            params={"wait": 20},
            headers={"Authorization": f"Bearer {tokens['stop-b']}"},
            timeout=30,
        )

    def live_stream() -> list[str]:
        with httpx.stream(
            "GET", f"{backend.url}/api/v1/stream", headers=ADMIN, timeout=30
        ) as stream:
            return [line for line in stream.iter_lines() if line.startswith("event:")]

    poll, polled = _in_thread(long_poll)
    sse, streamed = _in_thread(live_stream)
    poll.join(1.0)
    assert poll.is_alive() and sse.is_alive(), (polled, streamed)  # both held open

    assert backend.proc is not None
    backend.proc.send_signal(signal.SIGTERM)
    poll.join(5)
    sse.join(5)
    assert not poll.is_alive() and not sse.is_alive(), "still open after the server's SIGTERM"
    answer = polled["value"]
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == "1"
    assert answer.json() == {"detail": "server shutting down, retry"}
    assert "event: hello" in streamed["value"]  # then it ended, without an error

    assert backend.proc.wait(5) == 0
    log = procs.log(backend.name)
    assert "Traceback" not in log and "timeout graceful shutdown exceeded" not in log, log[-3000:]
    assert 500 not in backend.statuses(), log[-3000:]

    # The agent was told to poll again: one info line, no error, no traceback.
    wait_for(lambda: "command poll: HTTP 503: server shutting down" in procs.log(agent.log_name))
    assert agent.stop() == 0
    agent_log = procs.log(agent.log_name)
    assert "Traceback" not in agent_log and " ERROR " not in agent_log, agent_log[-3000:]
    assert agent_log.count("command poll failed") <= 1, agent_log[-3000:]
