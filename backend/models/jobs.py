"""Training jobs, their ranks and per-rank step timings."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from trainguard.backend.models.base import Base, BigId

JOB_STATES = ("running", "restarting", "waiting", "finished", "failed", "stopped")
# The job's processes are gone. `stopped` (stop_job: trainguard gave up restarting it) is
# not an end: the job may train on; it ends, finished or failed, when its ranks do.
JOB_ENDED = ("finished", "failed")


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)
    world_size: Mapped[int] = mapped_column(Integer, default=1)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    iteration: Mapped[int] = mapped_column(Integer, default=0)
    last_step: Mapped[int | None] = mapped_column(Integer)
    # running | restarting | waiting | finished | failed | stopped (JOB_STATES)
    state: Mapped[str] = mapped_column(
        String(16), default="running", server_default=text("'running'")
    )
    state_since: Mapped[float | None] = mapped_column(Float)
    state_reason: Mapped[str] = mapped_column(Text, default="", server_default=text("''"))
    # When the job ended (finished, failed or stopped): goodput is accounted up to here.
    ended_at: Mapped[float | None] = mapped_column(Float)
    # A readable name (the script's name and a short id), as the SDK declares it.
    display_name: Mapped[str | None] = mapped_column(String(128))
    # The codes of the timeout hierarchy's rules the job broke when last checked
    # (jobs.timeouts): a new one is announced by a `timeouts` event.
    timeout_warnings: Mapped[list[str]] = mapped_column(
        JSON, default=list, server_default=text("'[]'")
    )


class Rank(Base):
    __tablename__ = "ranks"
    __table_args__ = (UniqueConstraint("job_id", "rank"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    local_rank: Mapped[int] = mapped_column(Integer, default=0)
    pid: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    iteration: Mapped[int] = mapped_column(Integer, default=0)
    last_heartbeat: Mapped[float | None] = mapped_column(Float)
    last_step: Mapped[int | None] = mapped_column(Integer)
    alive: Mapped[bool] = mapped_column(Boolean, default=True)
    updated_at: Mapped[float] = mapped_column(Float)
    # What the rank supports, as its SDK declares it (None: not declared, an older SDK):
    # in_process only under NVRx's inprocess.Wrapper; the launcher that respawns it.
    in_process: Mapped[bool | None] = mapped_column(Boolean)
    launcher: Mapped[str | None] = mapped_column(String(16))
    # The launcher's restart budget (--max-restarts) and the restarts of it used, as the
    # rank's environment says (None: unknown).
    max_restarts: Mapped[int | None] = mapped_column(Integer)
    restart_count: Mapped[int | None] = mapped_column(Integer)
    # The timeouts around the rank (wire.Timeouts' fields, seconds), as its agent last
    # reported them (None: none reported).
    timeouts: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class Step(Base):
    __tablename__ = "steps"
    __table_args__ = (
        Index("ix_steps_job_end", "job_id", "end"),
        Index("ix_steps_job_rank_step", "job_id", "rank", "step"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    start: Mapped[float] = mapped_column(Float)
    end: Mapped[float] = mapped_column(Float)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    iteration: Mapped[int] = mapped_column(Integer, default=0)
    compute_s: Mapped[float | None] = mapped_column(Float)  # the rank's own work in the step


class NodeLauncher(Base):
    """A torchrun or ft_launcher of a job on a node, as its agent last listed them
    (wire.LauncherStatus): the job's shape, hot spares included (a spare's launcher
    starts no rank, so only this says it is there). A node's rows are replaced by each
    list its agent sends."""

    __tablename__ = "node_launchers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    pid: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))  # active | spare | restarting
    launcher: Mapped[str] = mapped_column(String(16))  # torchrun | ft_launcher
    min_nodes: Mapped[int | None] = mapped_column(Integer)  # --nnodes MIN:MAX
    max_nodes: Mapped[int | None] = mapped_column(Integer)
    ranks: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[float | None] = mapped_column(Float)
    reported_at: Mapped[float] = mapped_column(Float)  # when the backend received the list
