"""`trainguard server` tunes CPython's collector before it serves (backend/app.py:
tune_gc): full collections of the whole heap stalled every ingest request in flight."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import uvicorn
from typer.testing import CliRunner

from agent.cli import app
from backend.app import GC_THRESHOLDS
from tests.support import TOKEN


def test_the_server_freezes_its_startup_objects_and_collects_young_ones_less_often(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: dict[str, object] = {}

    def serve(api: object, **_: object) -> None:  # what uvicorn.run finds when it starts
        seen["frozen"] = gc.get_freeze_count()
        seen["thresholds"] = gc.get_threshold()

    monkeypatch.setattr(uvicorn, "run", serve)
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0 and before != GC_THRESHOLDS
    try:
        result = CliRunner().invoke(
            app,
            ["server", "--data-dir", str(tmp_path)],
            env={"TRAINGUARD_ADMIN_TOKEN": TOKEN},
        )
    finally:  # this test process must not keep the server's settings
        gc.unfreeze()
        gc.set_threshold(*before)
    assert result.exit_code == 0, result.output
    assert seen["thresholds"] == GC_THRESHOLDS
    # Everything alive once the app is built (modules, classes, the app) is out of reach
    # of the collector: tens of thousands of objects, not a handful.
    assert isinstance(seen["frozen"], int) and seen["frozen"] > 10_000
