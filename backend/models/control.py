"""Incidents, the commands that carry out their decisions, phase acks, and the audit log."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from backend.models.base import Base

TIMELINE = (
    "fault_at",
    "detected_at",
    "decided_at",
    "delivered_at",
    "torn_down_at",
    "restarted_at",
    "resumed_at",
)


class Incident(Base):
    __tablename__ = "incidents"
    __table_args__ = (Index("ix_incidents_job_status", "job_id", "status"),)

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
