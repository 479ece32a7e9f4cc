"""The options of `trainguard bench chaos` (backend/bench/chaos.py runs it): the mix of
faults, the shape of the job and of the nodes, the bench's own faults from outside the
job (backend/bench/chaos_outside.py), `parse_config` that checks the CLI's options, and
the plan of faults a job run injects (examples/faults.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The mix of the job's own faults (examples/faults.py weights; "xid" is XID 79: the simulated
# GPU falls off the bus). The bench's faults from outside come on top.
DEFAULT_KINDS = "exception:0.3,sigkill:0.25,hang:0.2,xid:0.25"
# The bench's own faults, from outside the job, one at a time (chaos_outside.py):
# agent_death (SIGKILL to a node's agent), agent_stop (SIGTERM to it: a graceful stop, its
# last batch says `going_away`), user_sigterm (SIGTERM to the job's launchers on every
# node, as scancel or Ctrl-C would) and manual_restart (an operator's launcher restarts
# through the REST API, against the launcher's restart budget).
BENCH_KINDS = ("agent_death", "agent_stop", "user_sigterm", "manual_restart")
DEFAULT_BENCH_KINDS = "agent_death:0.3,agent_stop:0.3,user_sigterm:0.15,manual_restart:0.25"
GPUS_PER_NODE = 2
RANKS_PER_NODE = 2


class ChaosError(RuntimeError):
    """A one-line reason the bench cannot run (bad argument, missing extra, no server)."""


@dataclass
class ChaosConfig:
    minutes: float
    seed: int = 42
    # Three imitated nodes: two train, one waits as the hot spare an exclusion swaps in
    # (docs/engine.md, "A node leaves the job"); a readmitted node is the next spare.
    nodes: int = 3
    spares: int = 1
    steps: int = 800  # per job run
    faults_per_run: int = 5
    after_step: int = 20
    min_gap: int = 100  # steps between two faults of a run, at least
    step_sleep: float = 0.1
    ckpt_every: int = 20
    kinds: str = DEFAULT_KINDS
    bench_kinds: str = DEFAULT_BENCH_KINDS
    bench_every_s: float = 90.0  # mean time between two of the bench's faults (0: none)
    agent_down_s: tuple[float, float] = (5.0, 25.0)  # how long a killed agent stays dead
    agent_stop_s: tuple[float, float] = (30.0, 90.0)  # how long a stopped agent stays so
    # Every second job run is launched with this --max-restarts when manual_restart is in
    # the mix, so that the operator's restarts meet the budget's 409 (docs/engine.md).
    small_max_restarts: int = 2
    force_share: float = 0.5  # of the 409s for the budget, how many the operator forces
    stall_s: float = 180.0  # a run without a new checkpoint for this long is stopped
    settle_s: float = 60.0  # at the end, how long to wait for open incidents to close
    observe_every_s: float = 2.0
    policy: str | None = None  # a policy TOML; None: the server's defaults, as the demo
    down_after_s: float = 15.0  # the server's node_down_after_s (its default)

    @property
    def world(self) -> int:
        """The job's ranks: those of the nodes that train (not the spares)."""
        return (self.nodes - self.spares) * RANKS_PER_NODE


def parse_config(
    minutes: str,
    seed: str,
    every: str = "90",
    steps: str = "800",
    faults: str = "5",
    kinds: str = DEFAULT_KINDS,
    bench_kinds: str = DEFAULT_BENCH_KINDS,
) -> ChaosConfig:
    """The CLI's options, checked; a bad one raises ChaosError with one line."""

    def number(name: str, text: str, kind: type, lo: float, hi: float) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise ChaosError(f"--{name} takes a number, not {text!r}") from None
        if not lo <= v <= hi:
            raise ChaosError(f"--{name} must be between {lo:g} and {hi:g}, not {text}")
        return v

    cfg = ChaosConfig(
        down_after_s=_down_after_s(),
        minutes=number("minutes", minutes, float, 0.5, 24 * 60),
        seed=number("seed", seed, int, 0, 2**31 - 1),
        bench_every_s=number("bench-every", every, float, 0, 86400),
        steps=number("steps", steps, int, 100, 10**6),
        faults_per_run=number("faults-per-run", faults, int, 0, 50),
        kinds=kinds,
        bench_kinds=bench_kinds,
    )
    if cfg.bench_every_s and cfg.bench_every_s < MIN_EVERY_S:
        raise ChaosError(f"--bench-every must be 0 or at least {MIN_EVERY_S:g} s")
    from trainguard.examples import faults as job_faults

    try:
        job_faults.parse_kinds(kinds)
    except ValueError as exc:
        raise ChaosError(f"--kinds: {exc}") from None
    try:
        _plan(cfg, 0)
    except ValueError as exc:
        raise ChaosError(f"bad fault plan: {exc}") from None
    try:
        parse_bench_kinds(bench_kinds)
    except ValueError as exc:
        raise ChaosError(f"--bench-kinds: {exc}") from None
    return cfg


# The gap between two of the bench's faults counts from the end of the first (an agent
# back, an operator done), so the mean only has to leave the job time to train between.
MIN_EVERY_S = 30.0


def parse_bench_kinds(text: str) -> dict[str, float]:
    """ "agent_death,agent_stop" (equal weights) or "agent_death:0.7,user_sigterm:0.3";
    "none" or "": no fault from outside."""
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, w = part.partition(":")
        if name == "none":
            continue
        if name not in BENCH_KINDS:
            raise ValueError(f"unknown kind {name!r}; choose from {', '.join(BENCH_KINDS)}")
        try:
            weights[name] = float(w) if w else 1.0
        except ValueError:
            raise ValueError(f"{name}: the weight must be a number, not {w!r}") from None
        if weights[name] < 0:
            raise ValueError(f"{name}: the weight must not be negative")
    return {k: v for k, v in weights.items() if v > 0}


def budget_run(cfg: ChaosConfig, n: int) -> bool:
    """Whether job run n is launched with the small --max-restarts (every second run, when
    the operator's restarts are in the mix)."""
    return "manual_restart" in parse_bench_kinds(cfg.bench_kinds) and n % 2 == 0


def _down_after_s() -> float:
    """The server's node_down_after_s (it runs with the bench's environment)."""
    from trainguard.backend.settings import Settings

    try:
        return float(Settings().node_down_after_s)
    except Exception as exc:
        raise ChaosError(f"bad server setting: {exc}".splitlines()[0]) from None


def _plan(cfg: ChaosConfig, run_seed: int) -> list[Any]:
    """The faults a job run injects: the plan every rank draws (examples/faults.py)."""
    from trainguard.examples import faults

    return faults.plan(
        cfg.faults_per_run,
        run_seed,
        cfg.after_step,
        cfg.steps,
        cfg.world,
        faults.parse_kinds(cfg.kinds),
        cfg.min_gap,
    )
