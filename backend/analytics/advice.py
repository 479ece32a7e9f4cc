"""Checkpoint-interval advice: Young's and Daly's optimum and the first-order waste model
(reference/anchors.md). Times in seconds; pure functions."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# Llama 3 405B (arXiv 2407.21783): 419 unexpected interruptions in 54 days on 16,384 GPUs,
# i.e. one every ~3.1 h for the job and one per ~50,700 h per GPU.
LLAMA3_GPUS = 16_384
LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_MTBF_PER_GPU_S = LLAMA3_DAYS * 86400 * LLAMA3_GPUS / LLAMA3_INTERRUPTIONS


def young(cost_s: float, mtbf_s: float) -> float:
    """Young: T_opt = sqrt(2 C M)."""
    return math.sqrt(2 * cost_s * mtbf_s)


def daly(cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum: sqrt(2dM)[1 + (1/3)sqrt(d/2M) + (1/9)(d/2M)] - d for
    d < 2M, else M."""
    d, m = cost_s, mtbf_s
    if d >= 2 * m:
        return m
    x = d / (2 * m)
    return math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d


def waste_fraction(interval_s: float, cost_s: float, restart_s: float, mtbf_s: float) -> float:
    """First-order waste: d/T (saving) + (T/2 + R)/M (lost work and restart per failure)."""
    return cost_s / interval_s + (interval_s / 2 + restart_s) / mtbf_s


def efficiency(interval_s: float, cost_s: float, restart_s: float, mtbf_s: float) -> float:
    return max(0.0, 1.0 - waste_fraction(interval_s, cost_s, restart_s, mtbf_s))


def recommend(
    cost_s: float | None,
    mtbf_s: float | None,
    restart_s: float | None,
    current_interval_s: float | None,
) -> dict[str, Any]:
    """The recommended interval (Daly) with Young's for reference, and the expected
    efficiency at the current and the recommended interval; None where an input is missing."""
    out: dict[str, Any] = {
        "daly_interval_s": None,
        "young_interval_s": None,
        "current_interval_s": current_interval_s,
        "expected_efficiency_current": None,
        "expected_efficiency_recommended": None,
    }
    if cost_s is None or mtbf_s is None or cost_s <= 0 or mtbf_s <= 0:
        return out
    r = restart_s or 0.0
    t = daly(cost_s, mtbf_s)
    out["daly_interval_s"] = t
    out["young_interval_s"] = young(cost_s, mtbf_s)
    out["expected_efficiency_recommended"] = efficiency(t, cost_s, r, mtbf_s)
    if current_interval_s:
        out["expected_efficiency_current"] = efficiency(current_interval_s, cost_s, r, mtbf_s)
    return out


def whatif(
    gpus: int,
    mtbf_per_gpu_s: float,
    checkpoint_cost_s: float,
    restart_s: Mapping[str, float],
    level_mix: Mapping[str, float] | None = None,
    interval_s: float | None = None,
) -> dict[str, Any]:
    """Expected goodput of a cluster: failures independent per GPU, so the job's MTBF is
    MTBF per GPU / GPUs. Per restart level (all failures recovered at that level), and for
    a mix of levels when one is given (weights are normalised)."""
    m = mtbf_per_gpu_s / gpus
    t_daly = daly(checkpoint_cost_s, m)
    t = interval_s or t_daly

    def row(level: str, r: float) -> dict[str, Any]:
        waste = waste_fraction(t, checkpoint_cost_s, r, m)
        eff = max(0.0, 1.0 - waste)
        return {
            "level": level,
            "restart_s": r,
            "expected_goodput": eff,
            "waste_fraction": min(1.0, waste),
            "lost_minutes_per_day": min(1.0, waste) * 1440,
            "restart_minutes_per_day": 86400 / m * r / 60,
        }

    levels = [row(level, r) for level, r in restart_s.items()]
    mixed = None
    if level_mix:
        total = sum(level_mix.values())
        r_mix = sum(w / total * restart_s[level] for level, w in level_mix.items())
        mixed = row("mix", r_mix)
        mixed["weights"] = {level: w / total for level, w in level_mix.items()}
    return {
        "gpus": gpus,
        "mtbf_per_gpu_s": mtbf_per_gpu_s,
        "job_mtbf_s": m,
        "failures_per_day": 86400 / m,
        "checkpoint_cost_s": checkpoint_cost_s,
        "interval_s": t,
        "daly_interval_s": t_daly,
        "young_interval_s": young(checkpoint_cost_s, m),
        "levels": levels,
        "mix": mixed,
    }
