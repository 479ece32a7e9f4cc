"""ORM classes; importing this package registers every table on Base.metadata."""

from trainguard.backend.models.auth import ApiToken
from trainguard.backend.models.base import Base
from trainguard.backend.models.cluster import (
    SAMPLE_BUCKET_S,
    SAMPLE_READINGS,
    Event,
    Gpu,
    IngestBatch,
    Node,
    NodeCordon,
    Sample,
    SampleRollup,
    in_sample_window,
    no_reading,
    sample_bucket,
)
from trainguard.backend.models.control import AuditLog, Command, CommandAck, Incident
from trainguard.backend.models.jobs import JOB_ENDED, JOB_STATES, Job, NodeLauncher, Rank, Step
from trainguard.protocol.wire import TIMELINE  # the timeline is part of the API contract

__all__ = [
    "JOB_ENDED",
    "JOB_STATES",
    "SAMPLE_BUCKET_S",
    "SAMPLE_READINGS",
    "TIMELINE",
    "ApiToken",
    "AuditLog",
    "Base",
    "Command",
    "CommandAck",
    "Event",
    "Gpu",
    "Incident",
    "IngestBatch",
    "Job",
    "Node",
    "NodeCordon",
    "NodeLauncher",
    "Rank",
    "Sample",
    "SampleRollup",
    "Step",
    "in_sample_window",
    "no_reading",
    "sample_bucket",
]
