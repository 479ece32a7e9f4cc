"""`trainguard bench decision` with an ingest load: the load must really run for the
figures to mean "under load". A spawned generator once died on start (its queue was
collected before it unpickled it) and the bench reported an unloaded run as loaded."""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

import pytest

from tests.support import free_port
from trainguard.backend.bench import decision


@pytest.mark.slow
def test_a_loaded_run_stores_the_loads_samples_and_delivers_every_event(
    tmp_path: Path,
) -> None:
    report = decision.run(
        events=3,
        interval=0.2,
        data_dir=tmp_path,
        port=free_port(),
        load_nodes=4,
        load_batch_interval=1.0,
    )
    assert report["delivered"] == 3 and report["missing"] == 0
    assert report["ingest_load"] == "4 nodes x 8 GPUs, a batch every 1 s"
    # 4 nodes x 8 GPUs, one sample a second each, for at least the warm-up (3 s).
    assert report["ingest_load_samples_stored"] >= 4 * 8 * 3


def test_a_load_generator_that_exited_refuses_the_result() -> None:
    ctx = mp.get_context("spawn")
    alive = ctx.Process(target=_sleep, args=(30,), daemon=True)
    dead = ctx.Process(target=sys.exit, args=(3,), daemon=True)
    alive.start()
    dead.start()
    dead.join(30)
    try:
        with pytest.raises(RuntimeError, match=r"1 of 2 ingest load generators exited .*\[3\]"):
            decision._check_load([alive, dead], "before the events")
        decision._check_load([alive], "before the events")  # all running: no complaint
    finally:
        alive.terminate()
        alive.join(10)


def _sleep(seconds: float) -> None:
    import time

    time.sleep(seconds)
