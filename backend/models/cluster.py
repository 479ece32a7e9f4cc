"""Nodes, their GPUs, GPU samples and events."""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from sqlalchemy import (
    JSON,
    REAL,
    BigInteger,
    Boolean,
    Computed,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    and_,
    any_,
    bindparam,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Mapped, mapped_column, relationship
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal

from trainguard.backend.models.base import Base, BigId


class Node(Base):
    __tablename__ = "nodes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    simulated: Mapped[bool] = mapped_column(Boolean, default=False)
    cordoned: Mapped[bool] = mapped_column(Boolean, default=False)
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)  # backend clock, last batch received
    agent_id: Mapped[str | None] = mapped_column(String(64))
    # Agent clock minus backend clock at the last batch (positive: the agent runs ahead).
    clock_offset_s: Mapped[float | None] = mapped_column(Float)
    # Summary of the last batch's samples, so the overview needs no scan of samples.
    util_avg: Mapped[float | None] = mapped_column(Float)
    temp_max: Mapped[float | None] = mapped_column(Float)
    # GPUs of that batch whose latest sample has no reading at all (fallen off the bus).
    gpus_lost: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_xid_at: Mapped[float | None] = mapped_column(Float)
    # The reason its agent gave in its last batch before a graceful stop (cleared by the
    # next batch): its silence is then `agent_down`, never evidence against the node.
    going_away: Mapped[str | None] = mapped_column(Text)

    gpus: Mapped[list[Gpu]] = relationship(back_populates="node", lazy="raise")


class NodeCordon(Base):
    """One cordon of a node, from the moment it was cordoned to its readmission: who or
    what cordoned it and why (the incident and its evidence), who readmitted it. The
    history of a node's cordons flags a node cordoned again and again for repair."""

    __tablename__ = "node_cordons"
    __table_args__ = (Index("ix_node_cordons_node_at", "node_id", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    at: Mapped[float] = mapped_column(Float)
    by: Mapped[str] = mapped_column(String(128))  # "engine" or an operator's name
    reason: Mapped[str] = mapped_column(Text, default="")
    incident_id: Mapped[int | None] = mapped_column(ForeignKey("incidents.id", ondelete="SET NULL"))
    evidence: Mapped[str] = mapped_column(Text, default="")  # the hardware evidence, in words
    released_at: Mapped[float | None] = mapped_column(Float)
    released_by: Mapped[str | None] = mapped_column(String(128))
    release_reason: Mapped[str | None] = mapped_column(Text)


class Gpu(Base):
    __tablename__ = "gpus"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    uuid: Mapped[str] = mapped_column(String(96), unique=True)
    index: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(256), default="")
    pci_bus_id: Mapped[str] = mapped_column(String(256), default="")
    memory_total_mib: Mapped[float | None] = mapped_column(Float)
    power_limit_w: Mapped[float | None] = mapped_column(Float)
    simulated: Mapped[bool] = mapped_column(Boolean, default=False)

    node: Mapped[Node] = relationship(back_populates="gpus", lazy="raise")


# Reading columns of a sample, in wire order; the ingest writer and the reads use this list.
SAMPLE_READINGS: tuple[str, ...] = (
    "util",
    "mem_util",
    "mem_used_mib",
    "mem_total_mib",
    "temp_c",
    "mem_temp_c",
    "power_w",
    "energy_mj",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "clock_event_reasons",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "remapped_correctable",
    "remapped_uncorrectable",
    "remap_pending",
    "remap_failure",
    "pcie_replay",
)
_READINGS = attrgetter(*SAMPLE_READINGS)
_NO_READING = (None,) * len(SAMPLE_READINGS)


def no_reading(sample: Any) -> bool:
    """A sample (a wire GpuSample or a Sample row: same attribute names) with every
    reading missing: NVML answers nothing for a GPU that fell off the bus (XID 79,
    NVML_ERROR_GPU_IS_LOST), and the agent still sends the sample. Such a GPU is lost."""
    return bool(_READINGS(sample) == _NO_READING)


# A sample's bucket: its time in SAMPLE_BUCKET_S windows, stored by the database itself
# (a generated column, so every writer gets it right). Samples are indexed by
# (bucket, gpu_id) (migrations 0011, 0012): the rows written in the last few seconds share
# one small region of the index, whatever the number of GPUs. Indexed by (gpu_id, ts),
# every GPU appended at a leaf page of its own: 131,072 GPUs kept ~1 GB of leaf pages hot,
# more than PostgreSQL's buffers, and each checkpoint wrote every one of them to the WAL
# again (docs/benchmarks.md, "The samples' index"). A read of one GPU's window names its
# buckets (in_sample_window).
SAMPLE_BUCKET_S = 8
# floor(ts / 8), PostgreSQL's text; on SQLite migration 0011 wrote CAST(ts / 8 AS INTEGER),
# the same for the wire's ts >= 0 and needing no math functions compiled in.
_BUCKET_SQL = f"CAST(floor(ts / {SAMPLE_BUCKET_S}) AS INTEGER)"


def sample_bucket(ts: float) -> int:
    """The bucket the database stores for a sample taken at `ts` (the column's formula)."""
    return int(ts // SAMPLE_BUCKET_S)


# Past this many buckets (4.6 days of raw samples) a window is read as a range of buckets:
# slower (it walks every GPU's rows in the range), but the statement stays small.
_MAX_LISTED_BUCKETS = 50_000


def in_sample_window(since: float, until: float) -> ColumnElement[bool]:
    """Samples with since <= ts <= until, by their buckets first: `bucket IN (...)` is
    one descent of the index per bucket, where a range over its leading column would
    walk every GPU's rows in the window. Callers add their GPUs (gpu_id)."""
    first, last = sample_bucket(max(since, 0.0)), sample_bucket(max(until, 0.0))
    by_bucket: ColumnElement[bool]
    if last - first < _MAX_LISTED_BUCKETS:
        by_bucket = _InBuckets(list(range(first, last + 1)))
    else:
        by_bucket = Sample.bucket.between(first, last)
    return and_(by_bucket, Sample.ts >= since, Sample.ts <= until)


class _InBuckets(ColumnElement[bool]):
    """`samples.bucket IN (...)`; on PostgreSQL `= ANY(:buckets)`, one array parameter.
    A 6-hour chart names 2,700 buckets: as that many parameters PostgreSQL's planner read
    the query in 107 ms, as one array in 76 (docs/benchmarks.md, "What reads pay").

    The buckets are bound parameters, children of the element: a statement's cache key
    is its shape, so a read repeated over other windows is compiled once (each dialect
    renders one of the two parameters; the other is never part of the SQL)."""

    type = Boolean()
    # A condition as it stands (as `x IN (...)` is), not a value SQLite must compare to 1.
    _is_implicitly_boolean = True
    inherit_cache = True
    _traverse_internals = [
        ("as_array", InternalTraversal.dp_clauseelement),
        ("as_list", InternalTraversal.dp_clauseelement),
    ]

    def __init__(self, buckets: list[int]) -> None:
        self.as_array = bindparam(None, buckets, type_=postgresql.ARRAY(Integer))
        self.as_list = bindparam(None, buckets, type_=Integer, expanding=True)


@compiles(_InBuckets)
def _in_buckets(element: _InBuckets, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(Sample.bucket.in_(element.as_list), **kw)


@compiles(_InBuckets, "postgresql")
def _in_buckets_pg(element: _InBuckets, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(Sample.bucket == any_(element.as_array), **kw)


class Sample(Base):
    """GPU readings at one instant (raw; bounded retention)."""

    __tablename__ = "samples"
    # One index, (bucket, gpu_id): every read is one GPU's (or node's) window, and the
    # retention pruner cuts the oldest buckets, a prefix of the index. No ts in it: with
    # that float8 in its key PostgreSQL could not deduplicate it, and without it a GPU's
    # samples of a bucket are one entry, a quarter of the bytes (migration 0012). No
    # surrogate id and no index on ts alone: each of them cost PostgreSQL as much per
    # stored sample as the heap row itself (migration 0009). The mapper's key is
    # (gpu_id, ts); the table has none, so two readings of one GPU at one instant are both
    # kept, as they were before.
    __table_args__ = (Index("ix_samples_bucket_gpu", "bucket", "gpu_id"),)
    __mapper_args__ = {"primary_key": ["gpu_id", "ts"]}

    # gpus.id, without a foreign key: checking one per row was half of PostgreSQL's work
    # per stored sample (docs/benchmarks.md, "Where the time went"). Every gpu_id comes
    # from the ingest writer, which resolves it from the gpus table in the same
    # transaction, and nothing deletes a GPU; retention deletes samples by age.
    gpu_id: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float)
    util: Mapped[float | None] = mapped_column(REAL)
    mem_util: Mapped[float | None] = mapped_column(REAL)
    mem_used_mib: Mapped[float | None] = mapped_column(REAL)
    mem_total_mib: Mapped[float | None] = mapped_column(REAL)
    temp_c: Mapped[float | None] = mapped_column(REAL)
    mem_temp_c: Mapped[float | None] = mapped_column(REAL)
    power_w: Mapped[float | None] = mapped_column(REAL)
    energy_mj: Mapped[float | None] = mapped_column(Float)
    sm_clock_mhz: Mapped[float | None] = mapped_column(REAL)
    mem_clock_mhz: Mapped[float | None] = mapped_column(REAL)
    clock_event_reasons: Mapped[int | None] = mapped_column(BigInteger)
    ecc_sbe_volatile: Mapped[int | None] = mapped_column(BigInteger)
    ecc_dbe_volatile: Mapped[int | None] = mapped_column(BigInteger)
    remapped_correctable: Mapped[int | None] = mapped_column(Integer)
    remapped_uncorrectable: Mapped[int | None] = mapped_column(Integer)
    remap_pending: Mapped[bool | None] = mapped_column(Boolean)
    remap_failure: Mapped[bool | None] = mapped_column(Boolean)
    pcie_replay: Mapped[int | None] = mapped_column(BigInteger)
    bucket: Mapped[int] = mapped_column(Integer, Computed(_BUCKET_SQL, persisted=True))


class SampleRollup(Base):
    """Samples aggregated into fixed windows (60 s, then 900 s) once raw data expires."""

    __tablename__ = "sample_rollups"

    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"), primary_key=True)
    width_s: Mapped[int] = mapped_column(Integer, primary_key=True)
    bucket: Mapped[float] = mapped_column(Float, primary_key=True)  # window start, Unix s
    n: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float)  # mean sample time in the window
    util: Mapped[float | None] = mapped_column(REAL)
    util_max: Mapped[float | None] = mapped_column(REAL)
    mem_util: Mapped[float | None] = mapped_column(REAL)
    mem_used_mib: Mapped[float | None] = mapped_column(REAL)
    temp_c: Mapped[float | None] = mapped_column(REAL)
    temp_max: Mapped[float | None] = mapped_column(REAL)
    power_w: Mapped[float | None] = mapped_column(REAL)
    sm_clock_mhz: Mapped[float | None] = mapped_column(REAL)
    mem_clock_mhz: Mapped[float | None] = mapped_column(REAL)
    ecc_sbe_volatile: Mapped[int | None] = mapped_column(BigInteger)
    ecc_dbe_volatile: Mapped[int | None] = mapped_column(BigInteger)
    remapped_uncorrectable: Mapped[int | None] = mapped_column(Integer)
    pcie_replay: Mapped[int | None] = mapped_column(BigInteger)


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_ts", "ts"),
        Index("ix_events_node_ts", "node_id", "ts"),
        Index("ix_events_kind_ts", "kind", "ts"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    ts: Mapped[float] = mapped_column(Float)
    received_at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    gpu_uuid: Mapped[str | None] = mapped_column(String(96))
    job: Mapped[str | None] = mapped_column(String(128))
    rank: Mapped[int | None] = mapped_column(Integer)
    xid: Mapped[int | None] = mapped_column(Integer)
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class IngestBatch(Base):
    """One accepted batch; its key makes a replayed batch a no-op. Kept as long as raw
    samples (the retention pruner drops keys by received_at with the samples' window):
    at 2,048 batches/s they were 177 M rows a day, never deleted."""

    __tablename__ = "ingest_batches"
    __table_args__ = (Index("ix_ingest_batches_received_at", "received_at"),)

    node_id: Mapped[int] = mapped_column(
        ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True
    )
    agent_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    received_at: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer, default=0)
    # The agent's goodbye (wire.Batch.going_away), kept per batch for the policy replay.
    going_away: Mapped[str | None] = mapped_column(Text)
