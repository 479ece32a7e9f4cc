"""A user's own training script, written from the README's SDK snippet alone: a small
model, data parallel on gloo, a checkpoint every few steps, and three trainguard lines.

Launch it with the line the README recommends (docs/restarts.md, "Plain torchrun
restarts", says why the variable is there):

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nproc-per-node 2 --max-restarts 3 \
        --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 --rdzv-id my-run \
        examples/train_user.py --ckpt-dir /tmp/my-run

On GPUs: `--backend nccl --device cuda` (each rank on GPU LOCAL_RANK; NCCL needs one GPU
per rank). The defaults are gloo on the CPU.

No trainguard setting: the SDK finds the node's agent at its well-known socket, the job is
named after `--rdzv-id`, and the rank declares `launcher: torchrun`, `in_process: false`
(no NVRx Wrapper here), so trainguard restarts this job through its launcher. After a
restart the new processes resume from the last checkpoint.
"""

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from trainguard import sdk


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--ckpt-dir", default="checkpoints")
    p.add_argument("--step-time", type=float, default=0.1, help="seconds of extra work a step")
    p.add_argument("--backend", default="gloo", help="torch.distributed backend (nccl on GPUs)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    return p.parse_args()


def batch(step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(32, 16, generator=g).to(device)
    return x, x[:, :4].sum(dim=1, keepdim=True)


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    tg = sdk.attach()  # job, rank, world size from torchrun's environment

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = Path(args.ckpt_dir) / "last.pt"
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt, map_location=device, weights_only=True)
        with tg.checkpoint("restore", state["step"]):
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = state["step"]
    print(f"rank {rank}/{world} pid {os.getpid()}: start at step {start}", flush=True)

    for step in range(start, args.steps):
        with tg.step(step):  # never blocks; raises RestartRequested when asked to restart
            with tg.compute():  # this rank's own work, not the wait in the all-reduce
                x, y = batch(step, rank, device)
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                time.sleep(args.step_time)
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
            opt.step()
        done = step + 1
        if done % args.ckpt_every == 0:
            with tg.checkpoint("save", done):
                if rank == 0:  # data parallel: every replica is the whole state
                    ckpt.parent.mkdir(parents=True, exist_ok=True)
                    tmp = ckpt.with_suffix(".tmp")
                    torch.save(
                        {"model": model.state_dict(), "opt": opt.state_dict(), "step": done}, tmp
                    )
                    os.replace(tmp, ckpt)
                dist.barrier()  # no rank runs ahead of the checkpoint it may restart from
    tg.finished()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
