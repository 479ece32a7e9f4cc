"""`backend/bench/soak.py` end to end, briefly: it drives a real backend and real agents
and reports their memory (the measured runs are in docs/reliability.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import free_port
from trainguard.backend.bench.soak import _slope_per_h, run

pytestmark = pytest.mark.slow


def test_slope_is_mib_per_hour() -> None:
    assert _slope_per_h([(0, 100.0), (60, 101.0), (120, 102.0)]) == pytest.approx(60.0)
    assert _slope_per_h([(0, 100.0)]) == 0.0


def test_a_short_soak_reports_backend_and_agent_memory(tmp_path: Path) -> None:
    report = run(
        minutes=0.25,
        nodes=8,
        agents=2,
        gpus=2,
        every_s=1.0,
        warmup_s=5.0,
        data_dir=tmp_path,
        port=free_port(),
        json_out=tmp_path / "soak.json",
        encoding="msgpack",  # what agents send a backend that offers it
    )
    assert report["generator_errors"] == 0 and report["encoding"] == "msgpack"
    assert report["stored_samples_per_s"] > 0
    # The generated nodes' samples, counted apart from the agents': all those sent.
    assert report["generated_stored_of_sent"] == 1.0
    assert report["latency_p99_ms"] >= report["latency_p50_ms"] > 0
    assert len(report["latency_p99_by_minute_ms"]) == 1 and report["first_batch_p99_ms"] > 0
    # The generators' own CPU, one figure per process: they share the host with the backend.
    assert len(report["load_generator_cpu_cores_by_process"]) == 1
    assert report["load_generator_cpu_cores"] > 0
    assert report["server_log_warnings"] == 0 and (tmp_path / "server.log").exists()
    assert 20 < report["backend_rss_mib_start"] <= report["backend_rss_mib_max"] < 2000
    assert 10 < report["agent_rss_mib_start"] <= report["agent_rss_mib_max"] < 1000
    assert (tmp_path / "soak.json").read_text().count('"backend_mib"') >= 10


def test_an_unknown_encoding_is_one_line_and_a_nonzero_exit() -> None:
    from typer.testing import CliRunner

    from trainguard.backend.bench.cli import app

    for command in ("soak", "ingest"):
        got = CliRunner().invoke(app, [command, "--encoding", "xml"])
        assert got.exit_code != 0 and "Traceback" not in got.output
        assert got.output.strip().endswith("--encoding must be json or msgpack, not 'xml'")
