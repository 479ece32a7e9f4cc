"""A training rank without torch, for the SDK/agent tests: steps at a fixed pace through
the real SDK and behaves like NVRx's Wrapper on RestartRequested (re-enters with the next
iteration in the same process), so it declares in_process (unless --detect: then the SDK
looks for a real Wrapper, and finds none). Faults on request: a hang inside a step
(heartbeats go on), one long step (to be interrupted by the SDK's signal), an exit, or an
exception nothing catches (inside a step, after the steps, or in a thread)."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trainguard import sdk


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10**9)
    p.add_argument("--step-s", type=float, default=0.02)
    p.add_argument("--hang-at", type=int, default=-1)
    p.add_argument("--long-step-at", type=int, default=-1)
    p.add_argument("--exit-at", type=int, default=-1)
    p.add_argument("--exit-code", type=int, default=3)
    p.add_argument("--heartbeat", type=float, default=0.2)
    p.add_argument("--signal-after", type=float, default=0.3)
    p.add_argument("--raise-at", type=int, default=-1, help="raise inside step N, uncaught")
    p.add_argument("--then-raise", action="store_true", help="raise after the last step")
    p.add_argument("--then-exit", type=int, default=None, help="sys.exit(CODE) after the steps")
    p.add_argument("--thread-raise", action="store_true", help="a thread raises, uncaught")
    p.add_argument("--detect", action="store_true", help="do not declare in_process")
    args = p.parse_args()
    tg = sdk.attach(
        heartbeat_interval=args.heartbeat,
        signal_after=args.signal_after,
        in_process=None if args.detect else True,
    )
    print(f"ready pid {os.getpid()} rank {tg.rank}", flush=True)
    iteration, step = 0, 0
    while step < args.steps:
        try:
            while step < args.steps:
                with tg.step(step):
                    if step == args.hang_at:
                        while True:  # stuck inside the step; the heartbeat thread goes on
                            time.sleep(0.05)
                    if step == args.long_step_at:
                        args.long_step_at = -1
                        time.sleep(30)
                    if step == args.exit_at:
                        sys.exit(args.exit_code)
                    if step == args.raise_at:
                        raise RuntimeError(f"injected failure at step {step}")
                    time.sleep(args.step_s)
                step += 1
        except sdk.RestartRequested as exc:
            iteration += 1
            print(f"restart requested ({exc}) at step {step}: iteration {iteration}", flush=True)
            tg.restart_iteration(iteration)
    tg.finished()
    if args.thread_raise:
        t = threading.Thread(target=_fail_in_thread, name="loader")
        t.start()
        t.join()
    if args.then_raise:
        raise ValueError("failure after the last step")
    if args.then_exit is not None:
        sys.exit(args.then_exit)
    tg.close()
    return 0


def _fail_in_thread() -> None:
    raise OSError("the data loader thread died")


if __name__ == "__main__":
    sys.exit(main())
