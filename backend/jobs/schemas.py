"""What the jobs routes take and answer (jobs.service, engine.queries.capabilities)."""

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


class Capabilities(BaseModel):
    """What the job's live ranks declared, and the restart levels it can carry out."""

    in_process: bool | None
    launchers: list[str]
    levels: list[str]


class JobDetail(Job):
    ranks: list[Rank]
    capabilities: Capabilities


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


class LaunchFailure(BaseModel):
    """A launcher of the job gave up before the job trained (its rendezvous closed, its
    workers never came up), with what it said."""

    model_config = {"extra": "forbid"}
    reason: str = Field(min_length=1, max_length=2000)
