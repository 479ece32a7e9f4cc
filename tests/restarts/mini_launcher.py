"""A worker launcher without torch (the role ft_launcher plays): keeps `--nproc` copies of
rank_script.py running and starts a fresh one, with the next restart count, whenever one
exits. The executor must end workers, never this process. MINI_LAUNCHER_RESTART_DELAY (s)
holds the new workers back after the old ones are gone (ft_launcher's restart takes
seconds: rendezvous, imports), so a command can arrive while no worker is alive.
MINI_LAUNCHER_MAX_RESTARTS is its restart budget (torchrun's --max-restarts): spent, it
ends its workers and exits 1 instead of restarting them. MINI_LAUNCHER_IGNORE_TERM=1 makes
it ignore SIGTERM (a launcher stuck in a rendezvous or a bad signal handler)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    nproc = int(sys.argv[1])
    extra = sys.argv[2:]
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    ignore = os.environ.get("MINI_LAUNCHER_IGNORE_TERM") == "1"
    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else on_term)
    restarts = 0
    delay = float(os.environ.get("MINI_LAUNCHER_RESTART_DELAY", "0"))
    budget = int(os.environ.get("MINI_LAUNCHER_MAX_RESTARTS", "1000000"))
    procs: dict[int, subprocess.Popen[bytes]] = {}

    def spawn(local_rank: int) -> None:
        env = dict(
            os.environ,
            RANK=str(local_rank),
            LOCAL_RANK=str(local_rank),
            WORLD_SIZE=str(nproc),
            TORCHELASTIC_RESTART_COUNT=str(restarts),
            # What torchrun gives its workers: the SDK declares launcher "torchrun", so the
            # engine knows a launcher respawns them.
            TORCHELASTIC_RUN_ID=os.environ.get("TORCHELASTIC_RUN_ID", "mini"),
        )
        procs[local_rank] = subprocess.Popen(
            [sys.executable, str(HERE / "rank_script.py"), *extra], env=env
        )

    for r in range(nproc):
        spawn(r)
    while not stop:
        dead = [r for r, p in procs.items() if p.poll() is not None]
        if dead:  # like a launcher: restart the whole worker group
            restarts += 1
            for p in procs.values():
                if p.poll() is None:
                    p.terminate()
            for p in procs.values():
                p.wait()
            if restarts > budget:
                return 1  # gave up, like torchrun past --max-restarts
            time.sleep(delay)
            for r in range(nproc):
                spawn(r)
        time.sleep(0.05)
    for p in procs.values():
        p.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
