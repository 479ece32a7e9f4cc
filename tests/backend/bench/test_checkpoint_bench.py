"""`trainguard bench checkpoint`: the advised interval in steps, and the demo's
`--ckpt-mode async-staged` saver (real gloo, real DCP files, read back by dcp.load)."""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from trainguard.backend.analytics import advice
from trainguard.backend.bench import checkpoint as bench

ROOT = Path(__file__).resolve().parents[3]
MIN = 60.0
HOUR = 3600.0


def test_advised_steps_is_dalys_interval_in_steps() -> None:
    # anchors.md: d = 5 min, M = 24 h -> 117 min; with one-minute steps, every 117 steps
    got = bench.advised_steps(5 * MIN, 24 * HOUR, step_s=MIN)
    assert got["interval_s"] == advice.daly(5 * MIN, 24 * HOUR)
    assert got["every_steps"] == 117
    assert got["expected_save_waste"] == pytest.approx(5 * MIN / got["interval_s"])


def test_advised_steps_for_a_fast_save_and_the_llama3_job_mtbf() -> None:
    # 15 ms per save, one interruption per ~3.1 h, 31 ms steps: ~18 s, ~590 steps
    got = bench.advised_steps(0.015, bench.DEFAULT_MTBF_S, step_s=0.031)
    assert got["interval_s"] == pytest.approx(18.3, abs=0.1)
    assert got["every_steps"] == round(got["interval_s"] / 0.031)
    assert got["expected_save_waste"] < 0.001


def test_advised_steps_refuses_a_zero_cost() -> None:
    with pytest.raises(ValueError, match="no advice"):
        bench.advised_steps(0.0, HOUR, step_s=0.1)


def test_quantile_is_nearest_rank() -> None:
    assert bench.quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert bench.quantile([5.0], 0.9) == 5.0
    assert bench.quantile([float(i) for i in range(11)], 0.9) == 9.0


@pytest.fixture(scope="module")
def demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_demo", ROOT / "examples/train_demo.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def gloo(tmp_path: Path) -> Iterator[dist.ProcessGroup]:
    """A real gloo process group of one rank, for DCP's collectives."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist.new_group(backend="gloo")
    finally:
        dist.destroy_process_group()


def _state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def _trained(demo: ModuleType) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model, opt = demo.build(demo.parse_args(["--hidden", "8"]))
    x, y = demo.batch(0, 0, 4)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()  # creates the momentum buffers, as in the demo before its first save
    return model, opt


def _loaded(demo: ModuleType, path: Path) -> dict:
    model, opt = _trained(demo)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    sd = _state(model, opt)
    dcp.load(sd, checkpoint_id=str(path))
    return sd


def test_staged_saver_writes_what_was_staged_and_reuses_its_buffers(
    demo: ModuleType, gloo: dist.ProcessGroup, tmp_path: Path
) -> None:
    model, opt = _trained(demo)
    saver = demo.StagedSaver(gloo)
    try:
        first = {k: v.clone() for k, v in model.state_dict().items()}
        fut = saver.save(_state(model, opt), str(tmp_path / "step_1"))
        with torch.no_grad():  # training goes on while the save runs
            for p in model.parameters():
                p.add_(1.0)
        fut.result(timeout=60)
        buffers = dict(saver.buffers)
        assert buffers  # one staging buffer per tensor of the state

        saver.save(_state(model, opt), str(tmp_path / "step_2")).result(timeout=60)
        assert all(saver.buffers[k] is b for k, b in buffers.items())  # refilled in place
    finally:
        saver.close()

    assert (tmp_path / "step_1" / ".metadata").exists()
    one = _loaded(demo, tmp_path / "step_1")["model"]
    two = _loaded(demo, tmp_path / "step_2")["model"]
    for k, v in first.items():
        assert torch.equal(one[k], v)  # the values at the save, not the later ones
        assert torch.equal(two[k], v + 1.0)


def test_staged_saver_refuses_to_refill_buffers_a_save_still_reads(
    demo: ModuleType, gloo: dist.ProcessGroup, tmp_path: Path
) -> None:
    model, opt = _trained(demo)
    saver = demo.StagedSaver(gloo)
    release = threading.Event()
    try:
        saver.pool.submit(release.wait)  # the save thread is busy: the next save waits
        fut = saver.save(_state(model, opt), str(tmp_path / "step_1"))
        with pytest.raises(RuntimeError, match="previous save"):
            saver.save(_state(model, opt), str(tmp_path / "step_2"))
        release.set()
        fut.result(timeout=60)
    finally:
        release.set()
        saver.close()
    assert (tmp_path / "step_1" / ".metadata").exists()
    assert not (tmp_path / "step_2").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkill_resumes_from_an_async_staged_checkpoint(tmp_path: Path) -> None:
    from tests.restarts.harness import launch_demo

    c = launch_demo(
        tmp_path,
        job="staged",
        steps=50,
        ckpt_every=10,
        faults=1,
        fault_after_step=25,
        fault_kinds="sigkill",
        fault_rank=2,
        extra_args=["--ckpt-mode", "async-staged"],
    )
    try:
        assert c.wait(240) == [0, 0], c.logs()
        fault_step = int(
            next(e for e in c.kinds("log") if e.message.startswith("injecting")).data["step"]
        )
        restored = [e for e in c.kinds("checkpoint") if e.data.get("phase") == "restore_end"]
        assert len(restored) == 4 and all(e.data.get("ok") for e in restored)
        ckpt_step = int(restored[0].data["step"])
        assert ckpt_step % 10 == 0 and 0 < ckpt_step <= fault_step
        new_gen = [s for s in c.steps if s.attempt == 1]
        assert min(s.step for s in new_gen) == ckpt_step
        assert max(s.step for s in new_gen) == 49
        # the last save, waited for before the ranks exit, is complete
        assert (tmp_path / "checkpoints" / "step_000050" / ".metadata").exists()
    finally:
        c.close()


def test_in_run_loss_counts_blocking_and_the_extra_time_of_overlapping_steps() -> None:
    # ten 100 ms steps back to back, except a 50 ms save (blocking) after step 4; its
    # background part runs until 0.75 s and slows the two steps it overlaps by 30 and 10 ms
    steps, t = [], 0.0
    for i in range(10):
        d = {5: 0.13, 6: 0.11}.get(i, 0.1)
        steps.append((t, t + d))
        t += d + (0.05 if i == 4 else 0.0)
    saves = [(0.5, 0.75)]  # starts at step 4's end, completes inside step 6
    got = bench.in_run_loss(steps, saves, [0.05])
    assert got["overlapped_steps"] == 2
    assert got["quiet_step_median_s"] == pytest.approx(0.1)
    assert got["overlap_extra_s"] == pytest.approx(0.04)
    assert got["lost_s"] == pytest.approx(0.09)
    assert got["span_s"] == pytest.approx(1.09)
    assert got["efficiency_in_run"] == pytest.approx(1 - 0.09 / 1.09)


def test_in_run_loss_floors_the_extra_time_at_zero_and_without_saves_is_one() -> None:
    steps = [(float(i), i + (0.9 if i == 3 else 1.0)) for i in range(5)]
    faster = bench.in_run_loss(steps, [(3.05, 3.5)], [0.01])  # the overlapped step is faster
    assert faster["overlap_extra_s"] == 0.0
    assert faster["lost_s"] == pytest.approx(0.01)
    assert bench.in_run_loss(steps, [], [])["efficiency_in_run"] == 1.0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_async_run_reports_its_in_run_efficiency() -> None:
    r = bench.run_one("async", 10, steps=40, step_sleep=0.02, timeout_s=240.0)
    assert r["checkpoints"] == 4
    assert len(r["save_windows_s"]) == 4  # one completion line per save (all ranks)
    assert all(w > 0 for w in r["save_windows_s"])
    assert r["overlapped_steps"] >= 1
    assert 0.0 < r["efficiency_in_run"] < 1.0
    assert r["lost_s"] >= r["blocking_total_s"] - 1e-3  # blocking_total_s is rounded
