"""The replay route's request and answer (docs/api-contract.md, "Policy replay")."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

# The longest policy text a request may carry (the default file is about 10 KB).
MAX_POLICY_CHARS = 100_000


class ReplayRequest(BaseModel):
    policy: str = Field(
        max_length=MAX_POLICY_CHARS,
        description="the candidate policy (TOML), merged over the default as a policy file is",
    )
    since: float | None = Field(default=None, description="period start (Unix s)")
    until: float | None = Field(default=None, description="period end (Unix s); default now")
    last_s: float | None = Field(
        default=None, gt=0, description="instead of since: the last this many seconds"
    )
    job: str | None = Field(default=None, max_length=128, description="one job only")

    @model_validator(mode="after")
    def _one_start(self) -> ReplayRequest:
        if (self.since is None) == (self.last_s is None):
            raise ValueError("give either since or last_s")
        return self


class RecoveryStat(BaseModel):
    median_s: float
    n: int


class RunTotals(BaseModel):
    incidents: int
    actions: dict[str, int]
    cordons: int
    breaker_holds: int
    escalations: int
    expected_recovery_s: float
    goodput_lost_s: float
    goodput_lost_gpu_s: float
    recovery_unknown: int


class SelfCheck(BaseModel):
    incidents: int
    mismatches: int
    exact: bool


class PolicyChange(BaseModel):
    key: str = Field(description="dotted, as in the policy file (breaker.max_fraction)")
    current: Any = Field(description="its value in the policy in force")
    candidate: Any = Field(description="its value in the candidate")


class ReplayReport(BaseModel):
    period: dict[str, float | str | None]
    evidence: int = Field(description="events of the period replayed")
    recovery_model: dict[str, RecoveryStat] = Field(
        description="measured recovery (resumed - fault) per level/launcher, with sample size"
    )
    totals: dict[str, RunTotals] = Field(description="recorded, current, candidate")
    self_check: SelfCheck
    differences: int | None = Field(description="incidents the candidate decides otherwise")
    incidents: list[dict[str, Any]] = Field(
        description="per incident: each run's summary; incident_id: the recorded (live) "
        "incident, null where the record has none"
    )
    policies: dict[str, str | None]
    policy_changes: list[PolicyChange] = Field(
        default_factory=list,
        description="the keys where the candidate differs from the policy in force "
        "(hook commands as set/empty)",
    )
    replay_s: float
