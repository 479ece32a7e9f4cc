"""ORM classes; importing this package registers every table on Base.metadata."""

from backend.models.auth import ApiToken
from backend.models.base import Base
from backend.models.cluster import (
    SAMPLE_READINGS,
    Event,
    Gpu,
    IngestBatch,
    Node,
    NodeCordon,
    Sample,
    SampleRollup,
)
from backend.models.control import TIMELINE, AuditLog, Command, CommandAck, Incident
from backend.models.jobs import JOB_ENDED, JOB_STATES, Job, Rank, Step

__all__ = [
    "JOB_ENDED",
    "JOB_STATES",
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
    "Rank",
    "Sample",
    "SampleRollup",
    "Step",
]
