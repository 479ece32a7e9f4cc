"""Minimal reproduction of plain torchrun restarts failing on gloo (no trainguard): a worker
group that all-reduces, one rank SIGKILLs itself in each of the first `--kills`
generations, torchrun restarts the group. Counts the restarts tried and resumed.

    python tests/restarts/torchrun_repro.py --runs 3 --rdzv static        # torchrun's default
    python tests/restarts/torchrun_repro.py --runs 3 --rdzv c10d          # shared store
    python tests/restarts/torchrun_repro.py --runs 3 --rdzv c10d --fix no-share
    python tests/restarts/torchrun_repro.py --runs 3 --rdzv static --fix prefix

The cause (docs/restarts.md, "Plain torchrun restarts"): torch 2.13's elastic agent keeps
one TCPStore for its whole life (static rendezvous: always; c10d: unless
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1) and its workers' env:// store has no per-restart
prefix, so gloo's address keys of the dead generation (`default_pg/0//cpu//0/<rank>`) are
still there when the next generation connects: a rank that reads a peer's key before the
peer rewrites it connects to a dead process ("Connection refused", or "Connect timeout").
Each worker prints whether those keys were present before its init_process_group.
`--fix no-share` sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (a fresh store per rendezvous
round, hosted by rank 0); `--fix prefix` builds the process group on a PrefixStore of its
own per TORCHELASTIC_RESTART_COUNT (single node only: on several nodes torchrun's restart
counts differ between nodes).
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def worker() -> None:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    kills = int(os.environ.get("REPRO_KILLS", "3"))
    timeout = datetime.timedelta(seconds=10)
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if shared:  # the agent's store: look for the previous generation's gloo keys
        probe = dist.TCPStore(addr, port, is_master=False, timeout=timeout)
        keys = [f"default_pg/0//cpu//0/{r}" for r in range(world)]
        print(f"REPRO attempt={attempt} rank={rank} stale={probe.check(keys)}", flush=True)
    try:
        if os.environ.get("REPRO_FIX") == "prefix":
            base = dist.TCPStore(addr, port, is_master=False, timeout=timeout)
            store = dist.PrefixStore(f"repro/attempt-{attempt}", base)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        else:
            dist.init_process_group("gloo", timeout=timeout)
    except Exception as exc:
        print(f"REPRO attempt={attempt} rank={rank} failed {str(exc)[:160]}", flush=True)
        raise
    x = torch.ones(4)
    for step in range(10):
        dist.all_reduce(x)
        if step == 0:
            print(f"REPRO attempt={attempt} rank={rank} resumed", flush=True)
        if step == 5 and rank == 1 and attempt < kills:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.1)
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--rdzv", choices=("static", "c10d"), default="static")
    p.add_argument("--fix", choices=("none", "no-share", "prefix"), default="none")
    args = p.parse_args()
    torchrun = Path(sys.executable).with_name("torchrun")
    tried = resumed = 0
    for run in range(args.runs):
        port = random.randint(20000, 30000)
        cmd = [str(torchrun), "--nproc-per-node", "2", "--max-restarts", str(args.kills)]
        if args.rdzv == "c10d":
            cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
            cmd += ["--rdzv-id", f"repro-{run}"]
        else:
            cmd += ["--master-port", str(port)]
        env = dict(os.environ, REPRO_KILLS=str(args.kills), OMP_NUM_THREADS="1")
        env["REPRO_FIX"] = args.fix
        if args.fix == "no-share":
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        with tempfile.TemporaryFile("w+") as out:
            rc = subprocess.call([*cmd, __file__], env=env, stdout=out, stderr=subprocess.STDOUT)
            out.seek(0)
            text = out.read()
        gens = {int(a) for a in re.findall(r"REPRO attempt=(\d+) rank=\d ", text)} - {0}
        ok = re.findall(r"REPRO attempt=(\d+) rank=\d resumed", text)
        back = {a for a in gens if ok.count(str(a)) == 2}
        stale = len(re.findall(r"stale=True", text))
        refused = text.count("Connection refused")
        tried, resumed = tried + len(gens), resumed + len(back)
        print(
            f"run {run}: exit {rc}, restarts {len(gens)}, resumed {len(back)}, workers that saw "
            f"stale keys {stale}, 'Connection refused' {refused}",
            flush=True,
        )
    print(f"{args.rdzv} fix={args.fix}: {resumed} of {tried} restarts resumed")
    return 0


if __name__ == "__main__":
    if "TORCHELASTIC_RUN_ID" in os.environ:
        worker()
    else:
        sys.exit(main())
