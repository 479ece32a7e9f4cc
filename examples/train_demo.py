"""trainguard's demo training job: a small MLP on synthetic data, data parallel on gloo,
under NVRx's in-process Wrapper and ft_launcher, with seeded faults.

Run by backend/demojob.py (two ft_launchers x 2 ranks stand for two nodes), or by hand:

    ft_launcher --nnodes 1 --nproc-per-node 2 --rdzv-backend c10d \
        --rdzv-endpoint 127.0.0.1:29500 --rdzv-id demo --max-restarts 3 \
        examples/train_demo.py --store-port 29600 --workdir /tmp/tg-demo

The measured configuration (docs/restarts.md):
- the Wrapper's store is a client of a TCPStore hosted outside the ranks (the agent, or
  `python -m trainguard.agent.executors.storehost`), so rank 0 faults are survivable;
- finalize releases gloo: destroy the process groups, clear the frames of the failed call's
  exception chain, gc.collect() (a peer blocked in a gloo receive is released only when the
  gloo context is destroyed);
- short gloo timeouts; a fresh application store prefix per generation and iteration;
- RetryController(min_world_size=full world): a lost rank ends the Wrapper and the launcher
  restarts the worker group, which resumes from the newest complete DCP checkpoint;
- `dcp.async_save` every N steps on its own gloo group, so saving does not block training
  (`--ckpt-mode async-staged`: the same DCP save from reused staging buffers in one
  long-lived thread; docs/benchmarks-checkpoint.md).

On GPUs: `--backend nccl --device cuda` (each rank on GPU LOCAL_RANK; NCCL needs one GPU
per rank); the checkpoint group stays on gloo. The defaults are gloo on the CPU.
"""

import argparse
import concurrent.futures
import contextlib
import copy
import datetime
import gc
import io
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trainguard import sdk

try:
    from nvidia_resiliency_ext import inprocess
except ImportError:  # no NVRx (no wheel for Python 3.13): only --no-wrapper runs
    inprocess = None
from trainguard.agent.executors import storehost
from trainguard.examples import faults

td = datetime.timedelta

CKPT_MODES = ("async", "async-staged", "sync", "torch", "none")


def _gather_objects_without_numpy() -> None:
    """torch.distributed's object collectives (used by DCP to gather save plans) decode
    bytes through numpy; when numpy is not installed, decode them without it."""
    try:
        import numpy  # noqa: F401 - imported to check it is installed
    except ImportError:
        c10d = dist.distributed_c10d

        def _tensor_to_object(tensor, tensor_size, group):
            buf = bytes(tensor.cpu()[: int(tensor_size)].tolist())
            return c10d._unpickler(io.BytesIO(buf)).load()

        c10d._tensor_to_object = _tensor_to_object


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--workdir", default="/tmp/trainguard-demo")
    p.add_argument("--job", default=None, help="job id (default: TORCHELASTIC_RUN_ID)")
    p.add_argument("--store-host", default="127.0.0.1")
    p.add_argument("--store-port", type=int, default=storehost.DEFAULT_PORT)
    p.add_argument(
        "--min-world-size",
        type=int,
        default=0,
        help="smallest world the Wrapper continues with (0: the full world)",
    )
    p.add_argument("--gloo-timeout", type=float, default=5.0)
    p.add_argument("--backend", default="gloo", help="the training group's backend (nccl on GPUs)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--soft-timeout", type=float, default=15.0)
    p.add_argument("--hard-timeout", type=float, default=25.0)
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument(
        "--ckpt-mode",
        choices=CKPT_MODES,
        default="async",
        help="async: dcp.async_save (default); async-staged: dcp.save in one long-lived "
        "thread from reused staging buffers; sync: dcp.save; torch: torch.save by rank 0 "
        "(not resumable); none: no checkpoints",
    )
    p.add_argument(
        "--ckpt-times",
        default=None,
        help="directory: one JSON line per save (start, end of the blocking, completion of "
        "the background save) in rank<R>-<pid>.jsonl, for `trainguard bench checkpoint`",
    )
    p.add_argument(
        "--no-wrapper",
        action="store_true",
        help="run without NVRx's in-process Wrapper: any fault ends the rank (the baseline "
        "of a plain full restart)",
    )
    faults.add_arguments(p)
    return p.parse_args(argv)


class ReleaseGloo(inprocess.finalize.Finalize if inprocess is not None else object):
    """Finalize that makes a restart fast on gloo: drop every reference to the gloo
    contexts so their sockets close and blocked peers are released."""

    def __init__(self, holder: dict) -> None:
        self.holder = holder

    def __call__(self, state):
        self.holder.pop("ckpt_pg", None)
        self.holder.pop("pending", None)  # an unfinished async save of the failed iteration
        saver = self.holder.pop("saver", None)
        if saver is not None:
            saver.close()
        if dist.is_initialized():
            with contextlib.suppress(Exception):  # already aborted
                dist.destroy_process_group()
        # The frames of the failed call (and of a gloo collective interrupted in it) hold
        # the process groups: on the faulting rank through fn_exception, on its peers
        # through the RankShouldRestart being handled now (it has no fn_exception).
        todo = [state.fn_exception, sys.exc_info()[1]]
        seen = set()
        while todo:
            exc = todo.pop()
            if exc is None or id(exc) in seen:
                continue
            seen.add(id(exc))
            if exc.__traceback__ is not None:
                traceback.clear_frames(exc.__traceback__)
            todo += [exc.__cause__, exc.__context__]
        gc.collect()
        return state


def wait_saved(fut: Any) -> None:
    """Wait for an async save in short slices: a blocking Future.result() sits in a lock
    acquire, where NVRx's restart exception cannot land (it is delivered only while Python
    code runs), so a rank waiting for its save would miss a restart until the save's
    collectives time out."""
    while True:
        try:
            fut.result(timeout=0.05)
            return
        except concurrent.futures.TimeoutError:
            continue


class StagedSaver:
    """`--ckpt-mode async-staged`: the save of `dcp.async_save` (a `dcp.save` of a CPU copy
    of the state, in a background thread, on the checkpoint group) without its per-save
    set-up. `dcp.async_save` builds at every call a new stager, deep-copies the state dict
    into new tensors and starts a new thread; here the staging buffers are allocated at the
    first save and refilled in place, and one thread serves every save of this train()
    call. The loop pays for the copies and a queue put. The files are those of
    `dcp.save`, so `dcp.load` reads them."""

    def __init__(self, pg: Any) -> None:
        self.pg = pg
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tg-ckpt")
        self.buffers: dict[str, torch.Tensor] = {}
        self.last: concurrent.futures.Future | None = None

    def stage(self, obj: Any, path: str = "") -> Any:
        """A copy of `obj` whose tensors live in this saver's buffers (one per path)."""
        if isinstance(obj, torch.Tensor):
            buf = self.buffers.get(path)
            if buf is None or buf.shape != obj.shape or buf.dtype != obj.dtype:
                buf = self.buffers[path] = torch.empty_like(obj, device="cpu")
            buf.copy_(obj.detach())
            return buf
        if isinstance(obj, dict):
            return {k: self.stage(v, f"{path}/{k}") for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return type(obj)(self.stage(v, f"{path}/{i}") for i, v in enumerate(obj))
        return copy.deepcopy(obj)

    def save(self, state: dict, checkpoint_id: str) -> concurrent.futures.Future:
        if self.last is not None and not self.last.done():
            # the buffers are still being written out: refilling them would tear the save
            raise RuntimeError("wait for the previous save before starting the next")
        staged = self.stage(state)
        self.last = self.pool.submit(
            dcp.save, staged, checkpoint_id=checkpoint_id, process_group=self.pg
        )
        return self.last

    def close(self) -> None:
        self.pool.shutdown(wait=False)


def save_checkpoint(args, mem, rank, model, opt, target: str, ckpt_root: Path) -> None:
    """One save in `args.ckpt_mode`; an asynchronous one leaves its future in mem["pending"]."""
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    pg = mem["ckpt_pg"]
    if args.ckpt_mode == "async":
        mem["pending"] = dcp.async_save(state, checkpoint_id=target, process_group=pg)
    elif args.ckpt_mode == "async-staged":
        if "saver" not in mem:
            mem["saver"] = StagedSaver(pg)
        mem["pending"] = mem["saver"].save(state, target)
    elif args.ckpt_mode == "sync":
        dcp.save(state, checkpoint_id=target, process_group=pg)
    elif rank == 0:  # torch: one replica is the whole state in data parallel
        ckpt_root.mkdir(parents=True, exist_ok=True)
        torch.save(state, f"{target}.pt")


def record_save(args, rank: int, step: int, start: float, blocked_end: float, fut) -> None:
    """`--ckpt-times`: a save's line, written when it completes (an asynchronous save's
    future: from its done callback; a synchronous one: at once). Epoch seconds, as steps."""

    def write(done: float) -> None:
        line = {"rank": rank, "step": step, "start": start, "blocked_end": blocked_end}
        path = Path(args.ckpt_times) / f"rank{rank}-{os.getpid()}.jsonl"
        with path.open("a") as f:
            f.write(json.dumps({**line, "done": done}) + "\n")

    if not args.ckpt_times:
        return
    Path(args.ckpt_times).mkdir(parents=True, exist_ok=True)
    if fut is None:
        write(blocked_end)
    else:
        fut.add_done_callback(lambda _f: write(time.time()))


def newest_checkpoint(root: Path) -> int:
    """The step of the newest complete checkpoint (one with .metadata), -1 if none."""
    best = -1
    if root.is_dir():
        for d in root.glob("step_*"):
            if (d / ".metadata").exists():
                try:
                    best = max(best, int(d.name.split("_")[1]))
                except ValueError:
                    continue
    return best


def device_of(args: argparse.Namespace) -> torch.device:
    """This rank's device: the CPU, or GPU LOCAL_RANK (made the current one)."""
    if args.device != "cuda":
        return torch.device("cpu")
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    return dev


def build(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)  # the same initial replica on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(32, args.hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 1),
    ).to(device_of(args))
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def batch(
    step: int, rank: int, size: int, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(size, 32, generator=g).to(device or "cpu")
    return x, x[:, :4].sum(dim=1, keepdim=True)


def train(args, tg, injector, mem, call_wrapper: Any = None):
    iteration = call_wrapper.iteration if call_wrapper is not None else 0
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    tg.restart_iteration(iteration, rank=rank, world_size=world)
    timeout = td(seconds=args.gloo_timeout)
    store = storehost.app_store(args.store_host, args.store_port, iteration, job=tg.job)
    device = device_of(args)
    dist.init_process_group(args.backend, store=store, rank=rank, world_size=world, timeout=timeout)
    ckpt_pg = dist.new_group(backend="gloo", timeout=td(seconds=max(30.0, args.gloo_timeout)))
    mem["ckpt_pg"] = ckpt_pg
    ckpt_root = Path(args.workdir) / "checkpoints"

    # Continue from memory when every rank holds the same step, else from disk.
    mine = mem["step"] if mem.get("model") is not None else -1
    t = torch.tensor([mine, -mine], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    lo, hi = int(t[0]), -int(t[1])
    if lo == hi and lo >= 0:
        model, opt, step = mem["model"], mem["opt"], mem["step"]
        source = "memory"
    else:
        model, opt = build(args)
        chosen = torch.tensor([newest_checkpoint(ckpt_root) if rank == 0 else -1], device=device)
        dist.broadcast(chosen, src=0)
        step = int(chosen[0])
        if step >= 0:
            with tg.checkpoint("restore", step):
                msd, osd = get_state_dict(model, opt)
                sd = {"model": msd, "optim": osd}
                dcp.load(
                    sd, checkpoint_id=str(ckpt_root / f"step_{step:06d}"), process_group=ckpt_pg
                )
                # dcp.load filled msd and osd in place
                set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
            source = f"checkpoint step {step}"
        else:
            step, source = 0, "scratch"
        mem.update(model=model, opt=opt, step=step)
    print(
        f"[demo] rank {rank}/{world} pid {os.getpid()} attempt {tg.attempt} iteration "
        f"{iteration}: step {step} from {source}",
        flush=True,
    )

    params = [p for p in model.parameters()]
    last_s = None
    while step < args.steps:
        with tg.step(step):
            t0 = time.perf_counter()
            # This rank's own work (a slow-rank fault slows it), not the all-reduce's wait:
            # straggler scores use these sections, as every rank's step lasts as long as the
            # slowest one's.
            with tg.compute():
                injector.before_step(step, rank, last_s)
                x, y = batch(step, rank, args.batch, device)
                opt.zero_grad(set_to_none=False)
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat)
            flat /= world
            offset = 0
            for p in params:
                n = p.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p))
                offset += n
            opt.step()
            if args.step_sleep:
                with tg.compute():  # stands for more model work
                    time.sleep(args.step_sleep)
            if call_wrapper is not None:
                call_wrapper.ping()
            last_s = time.perf_counter() - t0
        step += 1
        mem["step"] = step
        if args.ckpt_mode != "none" and step % args.ckpt_every == 0:
            # The loop is held from here: by a previous save still running, then by this one.
            save_t0 = time.time()
            with tg.checkpoint("save", step):
                pending = mem.pop("pending", None)
                if pending is not None:
                    wait_saved(pending)  # the previous save finished before the next starts
                target = str(ckpt_root / f"step_{step:06d}")
                save_checkpoint(args, mem, rank, model, opt, target, ckpt_root)
            record_save(args, rank, step, save_t0, time.time(), mem.get("pending"))
        if rank == 0 and step % 50 == 0:
            print(f"[demo] step {step} loss {loss.item():.4f}", flush=True)
    tg.finished()
    pending = mem.pop("pending", None)
    if pending is not None:
        wait_saved(pending)
    saver = mem.pop("saver", None)
    if saver is not None:
        saver.close()
    dist.barrier()
    dist.destroy_process_group()
    mem.pop("ckpt_pg", None)
    return step


def keep_own_health_checks_without_nvml(wrapper: Any) -> None:
    """NVRx 0.5+ chains NVML checks of this rank's GPU into every Wrapper (when LOCAL_RANK
    is set) and runs them before each in-process restart. This job trains on CPU beside
    simulated GPUs: where NVML does not load, those checks fail and every in-process
    restart ends the ranks (a launcher restart instead; docs/restarts.md, "NVRx
    versions"). There, the Wrapper keeps only the job's own checks (none here). On a GPU
    node NVML loads and NVRx's checks stay."""
    if sdk.in_process_blocker(wrapper) is not None:
        wrapper.restart_health_check = wrapper.health_check
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            print(
                "[demo] no NVML on this host (simulated GPUs): NVRx's GPU health checks "
                "before in-process restarts are left out",
                flush=True,
            )


def run_wrapped(args, tg, mem: dict, world: int, body) -> Any:
    """Run `body(call_wrapper)` under NVRx's in-process Wrapper, configured as measured
    (docs/restarts.md, "The demo job")."""
    logdir = Path(args.workdir).resolve() / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    wrapper = inprocess.Wrapper(
        store_factory=storehost.AgentStore,
        store_kwargs=storehost.store_kwargs(args.store_host, args.store_port, job=tg.job),
        initialize=inprocess.initialize.RetryController(
            min_world_size=args.min_world_size or world,
        ),
        finalize=ReleaseGloo(mem),
        monitor_thread_interval=td(seconds=0.1),
        monitor_process_interval=td(seconds=0.1),
        progress_watchdog_interval=td(seconds=0.1),
        heartbeat_interval=td(seconds=0.5),
        last_call_wait=td(seconds=0.1),
        soft_timeout=td(seconds=args.soft_timeout),
        hard_timeout=td(seconds=args.hard_timeout),
        heartbeat_timeout=td(seconds=10),
        barrier_timeout=td(seconds=60),
        completion_timeout=td(seconds=60),
        termination_grace_time=td(seconds=2),
        monitor_process_logfile=str(logdir / f"monitor-{tg.attempt}-{{rank}}.log"),
    )
    keep_own_health_checks_without_nvml(wrapper)

    # The Wrapper passes its CallWrapper to an argument annotated with the class (a real
    # annotation, not a string: this module does not use `from __future__ import annotations`).
    def fn(call_wrapper: inprocess.CallWrapper | None = None):
        return body(call_wrapper)

    return wrapper(fn)()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if inprocess is None and not args.no_wrapper:
        print(
            "train_demo: NVRx (nvidia-resiliency-ext) is not installed, so its Wrapper is "
            "not there: run with --no-wrapper (under torchrun), or install the train extra",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(1)
    _gather_objects_without_numpy()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    # Declared, not only detected (the SDK finds the Wrapper on the stack once the wrapped
    # function runs): the engine chooses in_process only for ranks that declare it.
    tg = sdk.attach(job=args.job, in_process=not args.no_wrapper)
    plan = faults.plan_from_args(args, args.steps, world) if args.faults else []
    injector = faults.Injector(
        plan,
        Path(args.workdir) / "faults",
        session=tg,
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
    )
    mem: dict = {}

    def reported(call_wrapper: Any = None):
        try:
            return train(args, tg, injector, mem, call_wrapper=call_wrapper)
        except Exception as exc:
            tg.report_exception(exc)
            raise
        except BaseException as exc:  # NVRx's RankShouldRestart: a peer failed
            tg.report_interrupted(type(exc).__name__)
            raise

    final = reported() if args.no_wrapper else run_wrapped(args, tg, mem, world, reported)
    print(f"[demo] rank {tg.rank} done at step {final}", flush=True)
    tg.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
