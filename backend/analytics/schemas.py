"""What the analytics routes take and answer (analytics.service, analytics.advice)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from trainguard.backend.analytics import advice

Level = Literal["in_process", "launcher", "exclude_node", "stop_job"]


# --- stragglers ------------------------------------------------------------------------


class RankStraggler(BaseModel):
    rank: int
    node: str
    local_rank: int
    gpu_uuid: str | None
    relative_score: float | None = Field(description="None until the detector scored a window")
    individual_score: float | None
    median_step_s: float | None
    flagged: bool
    flagged_since: float | None


class NodeStragglerSummary(BaseModel):
    node: str
    flagged: bool = Field(description="the whole node is flagged")
    ranks: int
    flagged_ranks: int
    gpus: list[str] = Field(description="GPUs of the flagged ranks")


class StragglerReport(BaseModel):
    job: str
    threshold: float
    unflag_threshold: float
    window_steps: int
    flag_windows: int
    unflag_windows: int
    reference_step_s: float | None
    evaluated_at: float | None
    ranks: list[RankStraggler]
    nodes: list[NodeStragglerSummary]


class FlaggedRank(BaseModel):
    rank: int | None
    gpu_uuid: str | None
    flagged_since: float | None


class NodeJobFlags(BaseModel):
    job: str
    node_flagged: bool
    ranks: list[FlaggedRank]


class GpuFlags(BaseModel):
    uuid: str
    index: int
    flagged: bool
    jobs: list[str]


class NodeStragglerReport(BaseModel):
    node: str
    flagged: bool
    jobs: list[NodeJobFlags]
    gpus: list[GpuFlags]


# --- goodput ---------------------------------------------------------------------------


class Badput(BaseModel):
    """Seconds per badput bucket (docs/goodput.md)."""

    initialization: float
    checkpoint_save: float
    checkpoint_restore: float
    recovery: float
    waiting: float = Field(
        description="waiting for capacity (no schedulable node); not part of goodput's job time"
    )
    wasted_progress: float
    reduced_world: float = Field(
        description="productive time lost to a smaller world than the job's largest "
        "(an elastic job on fewer nodes): a step at w of W ranks counts w / W productive"
    )
    straggler: float
    other: float


class GoodputBar(Badput):
    t: float = Field(description="start of the bar (Unix s)")
    dt: float
    goodput: float
    productive_s: float


class GoodputReport(BaseModel):
    job: str
    window: Literal["1h", "24h", "all"]
    since: float
    until: float
    elapsed_s: float
    productive_s: float
    goodput: float | None = Field(
        description="productive_s / (elapsed_s - badput.waiting); None for an empty window"
    )
    badput: Badput
    ideal_step_s: float | None
    productive_steps: int
    wasted_steps: int
    series: list[GoodputBar]


# --- advice ----------------------------------------------------------------------------


class NodeMtbf(BaseModel):
    node: str
    failures: int
    mtbf_s: float | None


class CheckpointStats(BaseModel):
    saves: int
    cost_s: float | None = Field(description="median blocking time of a save")
    interval_s: float | None = Field(description="median time between saves")
    restores: int
    restore_s: float | None


class LevelRestart(BaseModel):
    count: int
    median_s: float


class RestartStats(BaseModel):
    samples: int
    median_s: float | None
    by_level: dict[str, LevelRestart]


class Recommendation(BaseModel):
    daly_interval_s: float | None
    young_interval_s: float | None
    current_interval_s: float | None
    expected_efficiency_current: float | None
    expected_efficiency_recommended: float | None


class AdviceReport(BaseModel):
    job: str
    observed_s: float
    failures: int
    failures_without_incident: int
    mtbf_s: float | None
    mtbf_lower_bound_s: float | None
    mtbf_source: Literal["measured", "assumed"]
    assumed_mtbf_s: float
    gpus: int
    nodes: list[NodeMtbf]
    checkpoint: CheckpointStats
    restart: RestartStats
    recommendation: Recommendation


class WhatIf(BaseModel):
    model_config = {"extra": "forbid"}
    gpus: int = Field(ge=1, le=10_000_000, description="GPUs in the job")
    mtbf_per_gpu_h: float = Field(
        default=advice.LLAMA3_MTBF_PER_GPU_S / 3600,
        # Hours. Below 0.001 h (3.6 s) the failures per day leave the range of a float.
        ge=1e-3,
        le=1e9,  # beyond it too
        description="mean time between failures of one GPU (default: Llama 3's rate)",
    )
    checkpoint_cost_s: float = Field(gt=0, le=86400, description="blocking time of a save")
    checkpoint_interval_s: float | None = Field(
        default=None,
        ge=1e-3,
        le=1e9,
        description="interval to evaluate (default: Daly's optimum)",
    )
    restart_s: dict[Level, Annotated[float, Field(ge=0, le=86400)]] = Field(
        min_length=1, description="restart time per level, fault to resumed"
    )
    level_mix: dict[Level, Annotated[float, Field(ge=0, le=1e9)]] | None = Field(
        default=None, description="share of failures recovered at each level"
    )


class WhatIfLevel(BaseModel):
    level: str = Field(description='a restart level, or "mix"')
    restart_s: float
    expected_goodput: float
    waste_fraction: float
    lost_minutes_per_day: float
    restart_minutes_per_day: float
    weights: dict[str, float] | None = Field(
        default=None, description="the mix only: normalised weight of each level"
    )


class WhatIfResult(BaseModel):
    gpus: int
    mtbf_per_gpu_s: float
    job_mtbf_s: float
    failures_per_day: float
    checkpoint_cost_s: float
    interval_s: float
    daly_interval_s: float
    young_interval_s: float
    levels: list[WhatIfLevel]
    mix: WhatIfLevel | None
