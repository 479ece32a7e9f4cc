"""What the cluster routes take and answer (cluster.service, cluster.cordons)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class Cordon(BaseModel):
    id: int
    at: float
    by: str = Field(description='"engine" or an operator\'s name')
    reason: str
    incident_id: int | None
    evidence: str = Field(description="the hardware evidence, in words")
    released_at: float | None
    released_by: str | None
    release_reason: str | None


# Events the backend itself records (the agents' kinds are wire.EventKind): an agent
# silent while its node's ranks evidently run (backend/engine/silence.py) is an alert;
# a shadow rule that would have acted otherwise (backend/engine/decide.py) is recorded.
BackendEventKind = Literal["agent_silent", "shadow"]

NodeStatus = Literal["healthy", "degraded", "down", "agent_down", "cordoned"]


class Node(BaseModel):
    name: str
    status: NodeStatus = Field(
        description="cordoned, else agent_down (silent past node_down_after_s after its "
        "agent said it was going away: an upgrade, a stop), else down (silent past "
        "node_down_after_s), else degraded (late batches, an XID within 10 min, or a lost "
        "GPU), else healthy"
    )
    simulated: bool
    cordoned: bool
    first_seen: float
    last_seen: float
    gpu_count: int
    gpus_lost: int = Field(
        description="GPUs whose latest sample in the node's last batch has no reading at "
        "all: fell off the bus (XID 79) or lost by the driver"
    )
    clock_offset_s: float | None
    util_avg: float | None
    temp_max: float | None
    last_xid_at: float | None
    going_away: str | None = Field(
        None,
        description="the reason its agent gave in its last batch before a graceful stop; "
        "cleared by the agent's next batch",
    )
    cordon: Cordon | None = Field(description="the open cordon, if any")
    cordons_recent: int = Field(description="cordons within the repair window")
    repair: bool = Field(description="cordoned often enough to be flagged for repair")


class Readings(BaseModel):
    """One GPU sample (None where the GPU does not report it)."""

    util: float | None
    mem_util: float | None
    mem_used_mib: float | None
    mem_total_mib: float | None
    temp_c: float | None
    mem_temp_c: float | None
    power_w: float | None
    energy_mj: float | None
    sm_clock_mhz: float | None
    mem_clock_mhz: float | None
    clock_event_reasons: int | None
    ecc_sbe_volatile: int | None
    ecc_dbe_volatile: int | None
    remapped_correctable: int | None
    remapped_uncorrectable: int | None
    remap_pending: bool | None
    remap_failure: bool | None
    pcie_replay: int | None


class LatestSample(Readings):
    ts: float


class Gpu(BaseModel):
    uuid: str
    index: int
    name: str
    pci_bus_id: str
    simulated: bool
    memory_total_mib: float | None
    power_limit_w: float | None
    lost: bool = Field(description="its latest sample has no reading at all (XID 79, GPU lost)")
    latest: LatestSample | None


class NodeDetail(Node):
    gpus: list[Gpu]


class SampleColumns(BaseModel):
    """One list per reading, one entry per chart bucket; a row of nulls marks a gap."""

    ts: list[float]
    util: list[float | None]
    mem_util: list[float | None]
    mem_used_mib: list[float | None]
    mem_total_mib: list[float | None]
    temp_c: list[float | None]
    mem_temp_c: list[float | None]
    power_w: list[float | None]
    energy_mj: list[float | None]
    sm_clock_mhz: list[float | None]
    mem_clock_mhz: list[float | None]
    clock_event_reasons: list[int | None]
    ecc_sbe_volatile: list[int | None]
    ecc_dbe_volatile: list[int | None]
    remapped_correctable: list[int | None]
    remapped_uncorrectable: list[int | None]
    remap_pending: list[bool | None]
    remap_failure: list[bool | None]
    pcie_replay: list[int | None]


class GpuSeries(BaseModel):
    uuid: str
    simulated: bool
    since: float
    until: float
    points: int
    columns: SampleColumns


class Event(BaseModel):
    id: int
    ts: float
    received_at: float
    node: str | None
    kind: str
    gpu_uuid: str | None
    job: str | None
    rank: int | None
    xid: int | None
    message: str
    data: dict[str, Any] = Field(description="the event's own fields, by kind")


class CordonRequest(BaseModel):
    model_config = {"extra": "forbid"}
    reason: str = Field(default="", max_length=500)
    force: bool = Field(
        False,
        description="cordon a node that hosts live ranks: it leaves their jobs (its launcher "
        "there is ended, their other nodes restart without it), one incident per job",
    )


class CordonState(BaseModel):
    name: str
    cordoned: bool
    changed: bool = Field(
        True,
        description="whether this request changed the node (false: it was cordoned, or "
        "not cordoned, already; nothing was done but the audit)",
    )
    incidents: list[int] = Field(
        default_factory=list,
        description="the incidents opened for the jobs the node left (a forced cordon of a "
        "node with live ranks)",
    )
