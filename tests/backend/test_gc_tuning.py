"""`trainguard server` tunes CPython's collector before it serves (backend/app.py:
tune_gc): full collections of the whole heap stalled every ingest request in flight.
`TRAINGUARD_GC_TUNING=false` keeps CPython's defaults."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import uvicorn
from typer.testing import CliRunner

from tests.support import TOKEN
from trainguard.agent.cli import app
from trainguard.backend.app import GC_THRESHOLDS, Server


def _collector_when_serving(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **env: str
) -> tuple[int, tuple[int, int, int]]:
    """(frozen objects, thresholds) as the server finds them when it starts to serve
    (`app.Server.run`, uvicorn's server with the shutdown that ends long-polls)."""
    seen: list[tuple[int, tuple[int, int, int]]] = []

    def serve(server: uvicorn.Server, *_: object, **__: object) -> None:
        seen.append((gc.get_freeze_count(), gc.get_threshold()))
        server.started = True

    monkeypatch.setattr(Server, "run", serve)
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0 and before != GC_THRESHOLDS
    try:
        result = CliRunner().invoke(
            app,
            ["server", "--data-dir", str(tmp_path)],
            env={"TRAINGUARD_ADMIN_TOKEN": TOKEN, **env},
        )
    finally:  # this test process must not keep the server's settings
        gc.unfreeze()
        gc.set_threshold(*before)
    assert result.exit_code == 0, result.output
    [state] = seen
    return state


def test_the_server_freezes_its_startup_objects_and_collects_young_ones_less_often(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    frozen, thresholds = _collector_when_serving(monkeypatch, tmp_path)
    assert thresholds == GC_THRESHOLDS
    # Everything alive once the app is built (modules, classes, the app) is out of reach
    # of the collector: tens of thousands of objects, not a handful.
    assert frozen > 10_000


def test_gc_tuning_off_keeps_cpythons_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    defaults = gc.get_threshold()
    frozen, thresholds = _collector_when_serving(
        monkeypatch, tmp_path, TRAINGUARD_GC_TUNING="false"
    )
    assert (frozen, thresholds) == (0, defaults)
