"""Incidents, their evidence, the commands that carry out their decisions, phase acks,
the audit log, and the decision engine's durable state."""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from trainguard.backend.models.base import Base

# Incident status: open (being handled) | pending (a dry-run recommendation awaiting an
# operator) | resolved | failed | rejected (an operator said no) | stopped (stop_job: the
# engine gave up on the job and alerted).
INCIDENT_STATUSES = ("open", "pending", "resolved", "failed", "rejected", "stopped")
ACTIVE_STATUSES = ("open", "pending")
# An incident's level: the escalation ladder, cheapest first ...
LADDER = ("in_process", "launcher", "exclude_node", "stop_job")
# ... and what a cause may map to in the policy: a rung, a GPU reset (then launcher;
# exclude_node without a reset hook), or nothing.
ActionName = Literal["in_process", "launcher", "exclude_node", "stop_job", "reset_gpu", "ignore"]
ACTION_NAMES = (*LADDER, "reset_gpu", "ignore")


class Incident(Base):
    __tablename__ = "incidents"
    __table_args__ = (
        Index("ix_incidents_job_status", "job_id", "status"),
        Index("ix_incidents_status", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    created_at: Mapped[float] = mapped_column(Float)
    trigger: Mapped[str] = mapped_column(String(16))  # auto | manual
    triggered_by: Mapped[str] = mapped_column(String(128))
    cause: Mapped[str] = mapped_column(String(64))
    level: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    status: Mapped[str] = mapped_column(String(16), default="open")  # open|resolved|failed
    outcome: Mapped[str] = mapped_column(Text, default="")
    lost_steps: Mapped[int | None] = mapped_column(Integer)
    fault_step: Mapped[int | None] = mapped_column(Integer)
    fault_at: Mapped[float | None] = mapped_column(Float)
    detected_at: Mapped[float | None] = mapped_column(Float)
    decided_at: Mapped[float | None] = mapped_column(Float)
    delivered_at: Mapped[float | None] = mapped_column(Float)
    torn_down_at: Mapped[float | None] = mapped_column(Float)
    restarted_at: Mapped[float | None] = mapped_column(Float)
    resumed_at: Mapped[float | None] = mapped_column(Float)
    # Where the fault is, when it is one node's (an XID, a silent agent).
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="SET NULL"))
    gpu_uuid: Mapped[str | None] = mapped_column(String(96))
    xid: Mapped[int | None] = mapped_column(Integer)
    # The job's generation when the fault was decided on: the first step of a later
    # generation is the resumption even when no agent acked it.
    fault_attempt: Mapped[int | None] = mapped_column(Integer)
    fault_iteration: Mapped[int | None] = mapped_column(Integer)
    # Cooldown: the engine may not act on this incident before this time (backend clock).
    not_before: Mapped[float | None] = mapped_column(Float)
    # When the current action was issued (backend clock); acks of commands issued before
    # it belong to an action that was superseded by an escalation.
    acted_at: Mapped[float | None] = mapped_column(Float)
    closed_at: Mapped[float | None] = mapped_column(Float)
    escalations: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    # Every decision taken on this incident, oldest first: {at, level, why, by, mode}.
    decisions: Mapped[list[dict[str, Any]]] = mapped_column(
        JSON, default=list, server_default=text("'[]'")
    )
    # Hook runs (cordon, GPU reset): {hook, command, rc, output, started_at, duration_s}.
    hooks: Mapped[list[dict[str, Any]]] = mapped_column(
        JSON, default=list, server_default=text("'[]'")
    )


class IncidentEvidence(Base):
    """One piece of evidence merged into an incident: an event, or a fact the engine
    observed itself (a node gone silent, which has no event row)."""

    __tablename__ = "incident_evidence"
    __table_args__ = (Index("ix_incident_evidence_node_ts", "node_id", "ts"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    incident_id: Mapped[int] = mapped_column(
        ForeignKey("incidents.id", ondelete="CASCADE"), index=True
    )
    # The event row, when there is one (unique: an event is evidence of one incident).
    event_id: Mapped[int | None] = mapped_column(BigInteger, unique=True)
    kind: Mapped[str] = mapped_column(String(32))
    cause: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(16))  # what this evidence alone calls for
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="SET NULL"))
    rank: Mapped[int | None] = mapped_column(Integer)
    xid: Mapped[int | None] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float)  # the observing machine's clock
    received_at: Mapped[float] = mapped_column(Float)  # the backend's clock
    detail: Mapped[str] = mapped_column(Text, default="")


class EngineState(Base):
    """The decision engine's durable state (e.g. its cursor over events), so that a new
    leader continues where the last one stopped."""

    __tablename__ = "engine_state"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    updated_at: Mapped[float] = mapped_column(Float)


class Command(Base):
    """A durable instruction to one node's agent; pending until the agent acks delivery."""

    __tablename__ = "commands"
    __table_args__ = (Index("ix_commands_node_pending", "node_id", "delivered_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    incident_id: Mapped[int | None] = mapped_column(
        ForeignKey("incidents.id", ondelete="CASCADE"), index=True
    )
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    action: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    issued_at: Mapped[float] = mapped_column(Float)
    delivered_at: Mapped[float | None] = mapped_column(Float)


class CommandAck(Base):
    __tablename__ = "command_acks"

    command_id: Mapped[str] = mapped_column(
        ForeignKey("commands.id", ondelete="CASCADE"), primary_key=True
    )
    phase: Mapped[str] = mapped_column(String(16), primary_key=True)
    ts: Mapped[float] = mapped_column(Float)
    received_at: Mapped[float] = mapped_column(Float)
    detail: Mapped[str] = mapped_column(Text, default="")


class AuditLog(Base):
    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float, index=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(256))
    reason: Mapped[str] = mapped_column(Text, default="")
