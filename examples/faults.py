"""Seeded fault injection for the demo job, the method of AWS's NVRx failure simulator.

`plan(count, seed, after_step, total_steps, world_size)` draws the fault steps and the
target ranks (never rank 0, which the simulator also spares) with random.Random(seed): the
same arguments give the same plan on every rank and in every run. `Injector` applies the
plan inside the training loop; each fault fires once per job run, remembered in a marker
file, so a launcher restart that replays steps from a checkpoint does not fire it again.

Kinds:
- exception: raises InjectedFault (an in-process restart under NVRx's Wrapper); with
  `defer_s` > 0 the rank first reports the exception to its agent and waits inside the step
  up to `defer_s` seconds for trainguard's restart request (it raises RestartRequested
  when one comes, the InjectedFault when none does), so trainguard's engine, not the
  Wrapper's own reaction, chooses the restart (`--fault-defer-s`; 0, the default, raises at
  once);
- hang: the rank sleeps in a loop inside its step (heartbeats continue, steps stop);
- sigkill: SIGKILL to the rank itself (a launcher restart);
- slow: the rank's steps take `factor` times as long for `duration` steps (a straggler);
- xid: a simulated XID for the rank's GPU, posted through the local agent socket.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

KINDS = ("exception", "hang", "sigkill", "slow", "xid")
DEFAULT_WEIGHTS = {"exception": 0.35, "hang": 0.15, "sigkill": 0.2, "slow": 0.15, "xid": 0.15}


class InjectedFault(Exception):
    """The exception fault (an ordinary error in the training function)."""


@dataclass(frozen=True)
class Fault:
    index: int
    step: int
    rank: int
    kind: str
    hang_s: float = 60.0
    slow_factor: float = 3.0
    slow_steps: int = 20
    xid: int = 79
    defer_s: float = 0.0  # exception: wait this long for trainguard's decision first

    def describe(self) -> str:
        extra = {
            "hang": f" for up to {self.hang_s:g} s",
            "slow": f" x{self.slow_factor:g} for {self.slow_steps} steps",
            "xid": f" XID {self.xid}",
        }.get(self.kind, "")
        return f"fault {self.index}: {self.kind}{extra} on rank {self.rank} at step {self.step}"


def parse_kinds(text: str) -> dict[str, float]:
    """ "exception,sigkill" (equal weights) or "exception:0.7,sigkill:0.3"."""
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, w = part.partition(":")
        if name not in KINDS:
            raise ValueError(f"unknown fault kind {name!r}; choose from {', '.join(KINDS)}")
        weights[name] = float(w) if w else 1.0
    if not weights:
        raise ValueError("no fault kinds given")
    return weights


def plan(
    count: int,
    seed: int,
    after_step: int,
    total_steps: int,
    world_size: int,
    kinds: dict[str, float] | None = None,
    min_gap: int = 1,
    target_rank: int | None = None,
    defer_s: float = 0.0,
) -> list[Fault]:
    """The faults of one run: a pure function of its arguments. `target_rank` pins every
    fault to one rank (tests; the only way to aim at rank 0); the draws stay the same.
    `defer_s` goes to the exception faults (see the module docstring); no draw depends on it."""
    if count <= 0:
        return []
    if world_size < 2:
        raise ValueError("fault injection needs at least 2 ranks (rank 0 is never a target)")
    weights = kinds or DEFAULT_WEIGHTS
    candidates = list(range(after_step, total_steps, max(1, min_gap)))
    if len(candidates) < count:
        raise ValueError(
            f"{count} faults do not fit between step {after_step} and {total_steps} "
            f"with a gap of {min_gap}"
        )
    rng = random.Random(seed)
    steps = sorted(rng.sample(candidates, count))
    names, w = list(weights), list(weights.values())
    faults = []
    for i, s in enumerate(steps):
        rank = rng.randrange(1, world_size)
        kind = rng.choices(names, w)[0]
        faults.append(
            Fault(
                index=i,
                step=s,
                rank=rank if target_rank is None else target_rank,
                kind=kind,
                defer_s=defer_s if kind == "exception" else 0.0,
            )
        )
    return faults


class Injector:
    """Applies a plan in one rank: call `before_step(step)` inside each step."""

    def __init__(
        self,
        faults: list[Fault],
        state_dir: str | os.PathLike[str],
        session: Any = None,
        local_rank: int = 0,
    ) -> None:
        self.faults = faults
        self.state_dir = Path(state_dir)
        self.session = session
        self.local_rank = local_rank
        self.slow_until = -1
        self.slow_factor = 1.0
        self.slow_base_s = 0.0  # the rank's step time when the slow fault fired
        self.last_step_s = 0.0
        self.fired: list[Fault] = []

    def _claim(self, fault: Fault) -> bool:
        """True exactly once per fault and job run (an O_EXCL marker file)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        marker = self.state_dir / f"fault-{fault.index}.fired"
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(f"{time.time():.6f} {os.getpid()} {fault.describe()}\n")
        return True

    def before_step(self, step: int, rank: int, step_s: float | None = None) -> None:
        slowed = step <= self.slow_until
        if step_s and not slowed:  # a slowed step's time includes the injected delay
            self.last_step_s = step_s
        if slowed and self.slow_base_s > 0:
            # capped well below the gloo timeout: a straggler, not a hang
            time.sleep(min((self.slow_factor - 1.0) * self.slow_base_s, 1.0))
        for fault in self.faults:
            if fault.step == step and fault.rank == rank and self._claim(fault):
                self.fired.append(fault)
                self._fire(fault, step)

    def _fire(self, fault: Fault, step: int) -> None:
        print(f"[faults] rank {fault.rank} pid {os.getpid()}: {fault.describe()}", flush=True)
        if self.session is not None:
            self.session.log(
                f"injecting {fault.describe()}",
                **{k: v for k, v in asdict(fault).items() if isinstance(v, int | float | str)},
            )
        if fault.kind == "exception":
            if fault.defer_s > 0 and self.session is not None:
                self._defer(fault)
            raise InjectedFault(fault.describe())
        if fault.kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.kind == "hang":
            deadline = time.monotonic() + fault.hang_s
            while time.monotonic() < deadline:  # short sleeps: a restart can interrupt it
                time.sleep(0.05)
        elif fault.kind == "slow":
            self.slow_until = step + fault.slow_steps
            self.slow_factor = fault.slow_factor
            self.slow_base_s = self.last_step_s or 0.05
            time.sleep(min((self.slow_factor - 1.0) * self.slow_base_s, 1.0))
        elif fault.kind == "xid" and self.session is not None:
            with contextlib.suppress(Exception):
                self.session.inject_xid(
                    self.local_rank, fault.xid, f"injected by {fault.describe()}"
                )

    def _defer(self, fault: Fault) -> None:
        """Report the exception and wait for trainguard's restart request: the session's
        check_restart() raises RestartRequested when it arrives. Returns when `defer_s`
        passed without one (the caller then raises the fault itself)."""
        assert self.session is not None
        self.session.report_exception(InjectedFault(fault.describe()))
        deadline = time.monotonic() + fault.defer_s
        while time.monotonic() < deadline:
            self.session.check_restart()
            time.sleep(0.005)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--faults", type=int, default=0, help="number of faults to inject")
    p.add_argument("--fault-seed", type=int, default=42)
    p.add_argument("--fault-after-step", type=int, default=10)
    p.add_argument(
        "--fault-kinds", default=",".join(f"{k}:{v}" for k, v in DEFAULT_WEIGHTS.items())
    )
    p.add_argument("--fault-min-gap", type=int, default=1, help="steps between two faults at least")
    p.add_argument("--fault-rank", type=int, default=None, help="aim every fault at this rank")
    p.add_argument(
        "--fault-defer-s",
        type=float,
        default=0.0,
        help="an exception fault is reported to the agent and waits up to this long for "
        "trainguard's restart request before it raises (0: raise at once)",
    )


def plan_from_args(args: argparse.Namespace, total_steps: int, world_size: int) -> list[Fault]:
    return plan(
        args.faults,
        args.fault_seed,
        args.fault_after_step,
        total_steps,
        world_size,
        parse_kinds(args.fault_kinds),
        args.fault_min_gap,
        args.fault_rank,
        getattr(args, "fault_defer_s", 0.0),
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Print the fault plan a seed gives")
    add_arguments(p)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--world-size", type=int, default=4)
    args = p.parse_args(argv)
    for f in plan_from_args(args, args.steps, args.world_size):
        print(f.describe())


if __name__ == "__main__":
    main()
