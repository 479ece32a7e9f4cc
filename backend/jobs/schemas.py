"""What the jobs routes take and answer (jobs.service)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Job(BaseModel):
    name: str
    first_seen: float
    last_seen: float
    world_size: int
    attempt: int
    iteration: int
    last_step: int | None
    open_incidents: int
    display_name: str
    state: str
    state_since: float | None
    state_reason: str
    ended_at: float | None
    spare_capacity: int = Field(
        default=0,
        description="hot spares of the job that could join now: launchers waiting on nodes "
        "whose agent reports and that are not cordoned",
    )


class Rank(BaseModel):
    rank: int
    node: str
    local_rank: int
    pid: int
    attempt: int
    iteration: int
    last_heartbeat: float | None
    last_step: int | None
    alive: bool
    updated_at: float
    in_process: bool | None
    launcher: str | None
    max_restarts: int | None
    restart_count: int | None
    timeouts: dict[str, float | str] | None = Field(
        default=None, description="the timeouts around the rank as its agent reported them"
    )


class TimeoutWarning(BaseModel):
    """A rule of the timeout hierarchy the job breaks (docs/restarts.md, "Timeout
    hierarchy"); it never blocks the job."""

    code: str = Field(description="the rule, e.g. collective_over_checkpoint")
    message: str = Field(description="what goes wrong, with the two values")
    fix: str = Field(description="the fix, in one sentence")
    shorter: float = Field(description="seconds: what must be shorter (the job's largest)")
    longer: float = Field(description="seconds: what it must be shorter than (the smallest)")
    values: dict[str, float]


class Capabilities(BaseModel):
    """What the job's live ranks declared, and the restart levels it can carry out."""

    in_process: bool | None
    launchers: list[str]
    levels: list[str]


class Spare(BaseModel):
    node: str
    pid: int = Field(description="the waiting launcher's process on the node")
    launcher: str = Field(description="torchrun or ft_launcher")
    started_at: float | None
    reported_at: float = Field(description="when its agent last listed it")
    available: bool = Field(description="it could join now (counted as spare capacity)")
    why: str | None = Field(description="why it could not (agent down, node cordoned)")


class Excluded(BaseModel):
    node: str
    incident_id: int | None
    at: float = Field(description="when it was cordoned")
    reason: str


class Shape(BaseModel):
    """Which nodes train the job, which wait as hot spares, which were excluded, and its
    --nnodes MIN:MAX (docs/engine.md, "The job's shape")."""

    active: list[str] = Field(description="nodes with live ranks or an active launcher")
    spares: list[Spare] = Field(description="nodes whose launcher of the job waits")
    spare_capacity: int = Field(description="spares that could join now")
    excluded: list[Excluded] = Field(description="nodes cordoned by this job's incidents")
    min_nodes: int | None = Field(description="--nnodes MIN (None: no launcher reported)")
    max_nodes: int | None = Field(description="--nnodes MAX")
    elastic: bool = Field(description="MIN < MAX: the job may re-form smaller")
    reported: bool = Field(
        description="an agent listed launchers of the job (false: agents older than the "
        "launcher list, or no torchrun/ft_launcher: spares cannot be seen)"
    )


class JobDetail(Job):
    ranks: list[Rank]
    shape: Shape
    capabilities: Capabilities
    # The launcher's restart budget, from the live ranks (jobs.service.launcher_budget):
    # its --max-restarts, the restarts used, and what is left (None: not declared).
    # Faults and operator restarts at level launcher share it.
    max_restarts: int | None = Field(
        description="the launcher's --max-restarts: the job's whole budget of launcher "
        "restarts, shared by faults and operator restarts (None: unknown)"
    )
    restart_count: int | None = Field(description="launcher restarts used so far (None: unknown)")
    restarts_left: int | None = Field(
        description="max_restarts - restart_count of the live rank with the fewest left; "
        "at 0 the next worker failure ends the job (None: unknown)"
    )
    timeout_warnings: list[TimeoutWarning] = Field(
        default_factory=list,
        description="the rules of the timeout hierarchy the job's reported timeouts break",
    )


class StepColumns(BaseModel):
    rank: list[int]
    step: list[int]
    start: list[float]
    end: list[float]
    attempt: list[int]
    iteration: list[int]


class JobSteps(BaseModel):
    job: str
    columns: StepColumns


class RestartRequest(BaseModel):
    model_config = {"extra": "forbid"}
    level: Literal["in_process", "launcher"]
    reason: str = Field(min_length=1, max_length=500)
    force: bool = Field(
        default=False,
        description="a launcher restart that would use the launcher's last restart (or "
        "one it no longer has) is refused with 409 unless this is true",
    )


class LaunchFailure(BaseModel):
    """A launcher of the job gave up before the job trained (its rendezvous closed, its
    workers never came up), with what it said."""

    model_config = {"extra": "forbid"}
    reason: str = Field(min_length=1, max_length=2000)
