"""The options of `trainguard bench chaos` (backend/bench/chaos.py runs it): the mix of
faults, the shape of the job and of the nodes, the agent deaths, `parse_config` that
checks the CLI's options, and the plan of faults a job run injects (examples/faults.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The mix of the job's own faults (examples/faults.py weights; "xid" is XID 79: the simulated
# GPU falls off the bus). Agent deaths come on top, from the bench.
DEFAULT_KINDS = "exception:0.3,sigkill:0.25,hang:0.2,xid:0.25"
GPUS_PER_NODE = 2
RANKS_PER_NODE = 2


class ChaosError(RuntimeError):
    """A one-line reason the bench cannot run (bad argument, missing extra, no server)."""


@dataclass
class ChaosConfig:
    minutes: float
    seed: int = 42
    nodes: int = 2
    steps: int = 800  # per job run
    faults_per_run: int = 5
    after_step: int = 20
    min_gap: int = 100  # steps between two faults of a run, at least
    step_sleep: float = 0.1
    ckpt_every: int = 20
    kinds: str = DEFAULT_KINDS
    agent_every_s: float = 90.0  # mean time between two agent deaths (0: none)
    agent_down_s: tuple[float, float] = (5.0, 25.0)  # how long an agent stays dead
    stall_s: float = 180.0  # a run without a new checkpoint for this long is stopped
    settle_s: float = 60.0  # at the end, how long to wait for open incidents to close
    observe_every_s: float = 2.0
    policy: str | None = None  # a policy TOML; None: the server's defaults, as the demo
    down_after_s: float = 15.0  # the server's node_down_after_s (its default)


def parse_config(
    minutes: str, seed: str, agent_every: str = "90", steps: str = "800", faults: str = "5"
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
        agent_every_s=number("agent-every", agent_every, float, 0, 86400),
        steps=number("steps", steps, int, 100, 10**6),
        faults_per_run=number("faults-per-run", faults, int, 0, 50),
    )
    if cfg.agent_every_s and cfg.agent_every_s < 2 * cfg.agent_down_s[1]:
        raise ChaosError(f"--agent-every must be 0 or at least {2 * cfg.agent_down_s[1]:g} s")
    try:
        _plan(cfg, 0)
    except ValueError as exc:
        raise ChaosError(f"bad fault plan: {exc}") from None
    return cfg


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
        cfg.nodes * RANKS_PER_NODE,
        faults.parse_kinds(cfg.kinds),
        cfg.min_gap,
    )
