"""What the incident routes take and answer (incidents.reads.incident_dict)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


# An operator's answer to a dry-run recommendation (approve / reject).
class Answer(BaseModel):
    model_config = {"extra": "forbid"}
    reason: str = Field(min_length=1, max_length=500)


class Timeline(BaseModel):
    """The recovery timeline (Unix seconds; None until reached)."""

    fault_at: float | None
    detected_at: float | None
    decided_at: float | None
    delivered_at: float | None
    torn_down_at: float | None
    restarted_at: float | None
    resumed_at: float | None


class EvidenceItem(BaseModel):
    kind: str
    cause: str
    action: str
    node: str | None
    rank: int | None
    xid: int | None
    ts: float
    received_at: float
    event_id: int | None
    detail: str


class CommandPhase(BaseModel):
    phase: str
    ts: float
    detail: str


class IncidentCommand(BaseModel):
    id: str
    node: str
    action: str
    issued_at: float
    delivered_at: float | None
    acks: list[CommandPhase]


class ShadowDecision(BaseModel):
    at: float
    rule: str = Field(description="the shadow rule, e.g. causes.hang")
    action: str = Field(description="what it would have done")
    instead_of: str = Field(description="what the rule in force did")
    cause: str


class Incident(BaseModel):
    id: int
    incident_id: int = Field(description="the same as `id`")
    job: str | None
    job_state: str | None
    created_at: float
    trigger: str = Field(description="auto | manual")
    triggered_by: str
    cause: str
    level: str
    reason: str
    status: str = Field(description="open | pending | resolved | failed | rejected | stopped")
    outcome: str
    fault_step: int | None
    lost_steps: int | None
    node: str | None
    gpu_uuid: str | None
    xid: int | None
    escalations: int
    not_before: float | None
    acted_at: float | None
    closed_at: float | None
    timeline: Timeline
    recovery_s: float | None = Field(description="fault to resumed, when both are known")
    decisions: list[dict[str, Any]] = Field(description="the engine's and operators' entries")
    shadow: list[ShadowDecision] = Field(
        default_factory=list,
        description="what the policy's shadow rules would have done on its evidence "
        "(recorded, never acted on)",
    )
    hooks: list[dict[str, Any]] = Field(description="results of the hooks run for it")
    evidence: list[EvidenceItem]
    commands: list[IncidentCommand]


IncidentOut = Incident  # for modules where `Incident` names the ORM class
