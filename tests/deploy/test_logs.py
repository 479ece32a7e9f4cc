"""Structured JSON logs: a real server process (uvicorn with the JSON log config, as
`trainguard server --log-format json` runs it) writes only JSON lines, access lines with
their fields and the stream's access_token redacted."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support import TOKEN, free_port, wait_for
from trainguard.backend.logs import JsonFormatter, format_from_env, uvicorn_log_config

ROOT = Path(__file__).resolve().parents[2]

SERVE = """
import sys, uvicorn
from trainguard.backend.app import create_app
from trainguard.backend.logs import uvicorn_log_config
from trainguard.backend.settings import Settings
app = create_app(Settings(data_dir=sys.argv[2], admin_token=sys.argv[3]))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]),
            log_config=uvicorn_log_config("json", "info"), timeout_graceful_shutdown=3)
"""


def test_a_json_server_writes_one_json_object_per_line(tmp_path: Path) -> None:
    port = free_port()
    err = (tmp_path / "stderr").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(port), str(tmp_path), TOKEN],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=err,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _ok(f"{base}/healthz"), timeout=60)
        # (only the stream takes ?access_token=; any path with one is redacted in the log)
        r = httpx.get(f"{base}/api/v1/nodes?access_token={TOKEN}", timeout=5)
        assert r.status_code == 401
    finally:
        proc.terminate()
        proc.wait(20)
    lines = [ln for ln in (tmp_path / "stderr").read_text().splitlines() if ln.strip()]
    records = [json.loads(ln) for ln in lines]  # every line is JSON
    assert all({"ts", "level", "logger", "message", "pid"} <= r.keys() for r in records)
    (access,) = [r for r in records if r["logger"] == "uvicorn.access" and "nodes" in r["path"]]
    assert access["method"] == "GET" and access["status"] == 401
    assert access["path"] == "/api/v1/nodes?access_token=<redacted>"
    assert TOKEN not in (tmp_path / "stderr").read_text()
    assert any(r["logger"] == "uvicorn.error" and "startup" in r["message"] for r in records)
    assert records[0]["ts"].endswith("Z") and "T" in records[0]["ts"]


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_extra_fields_and_tracebacks_become_fields() -> None:
    fmt = JsonFormatter()
    rec = logging.LogRecord("backend.x", logging.ERROR, __file__, 1, "job %s", ("j1",), None)
    rec.incident_id = 12
    try:
        raise ValueError("boom")
    except ValueError:
        rec.exc_info = sys.exc_info()
    out = json.loads(fmt.format(rec))
    assert out["message"] == "job j1" and out["level"] == "error" and out["incident_id"] == 12
    assert "ValueError: boom" in out["exc"]


def test_the_format_is_text_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    assert uvicorn_log_config("text")["formatters"]["main"]["format"]
    with pytest.raises(ValueError, match="text or json"):
        uvicorn_log_config("xml")  # type: ignore[arg-type]  # a wrong format on purpose
    monkeypatch.setenv("TRAINGUARD_LOG_FORMAT", "JSON")
    assert format_from_env() == "json"
    monkeypatch.setenv("TRAINGUARD_LOG_FORMAT", "yaml")
    with pytest.raises(ValueError, match="TRAINGUARD_LOG_FORMAT"):
        format_from_env()
