"""The wire format between the node agent and the backend, defined once, here.

The agent is the producer, so the format lives in the agent; the backend imports it and
never the other way round. Every message is a msgspec Struct: decoding validates types,
bounds and unknown fields in one pass (about 1.5M samples/s on one core), and the error
names the offending field, e.g. "Expected `float | null`, got `str` - at `$.samples[3].util`".

Times are Unix epoch seconds (float, UTC) from the observing machine's clock.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from trainguard.protocol.payloads import (
    EVENT_DATA,
    CommandParams,
    EventData,
    check_event_data,
    command_params,
    event_data,
)

WIRE_VERSION = 1

# Limits shared by producer and consumer: the agent splits batches to stay inside them,
# the backend refuses what exceeds them with a 4xx that says which one.
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_SAMPLES = 8192
MAX_EVENTS = 2048
MAX_STEPS = 16384
MAX_RANKS = 1024
MAX_GPUS = 64

# Names appear in URL paths (/nodes/{node}, /jobs/{job}): no "/" in them.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$"
Name = Annotated[str, Meta(min_length=1, max_length=128, pattern=NAME_PATTERN)]
_NAME_BAD = re.compile(r"[^A-Za-z0-9._:@-]")


def wire_name(text: str) -> str:
    """`text` made into a wire name (1-128 characters of the allowed set)."""
    name = _NAME_BAD.sub("-", text.strip())[:128]
    return name if name[:1].isalnum() else ("j" + name)[:128]


Uuid = Annotated[str, Meta(min_length=1, max_length=96)]
Text = Annotated[str, Meta(max_length=4096)]
Short = Annotated[str, Meta(max_length=256)]
Ts = Annotated[float, Meta(ge=0.0, le=1e11)]
# A sample's time: the backend stores floor(ts / 8) in a 32-bit column (its index's
# bucket, migration 0011), so the bound is below 8 * 2**31; 1.7e10 s is the year 2508.
SampleTs = Annotated[float, Meta(ge=0.0, le=1.7e10)]
Pct = Annotated[float, Meta(ge=0.0, le=100.0)]
NonNegF = Annotated[float, Meta(ge=0.0)]
NonNeg = Annotated[int, Meta(ge=0)]
Count = Annotated[int, Meta(ge=0, le=2**63 - 1)]
# A count the backend stores in a 32-bit column: bounded here, so the decoder refuses a
# larger one with the field's path (no second pass over every sample after decoding).
Count32 = Annotated[int, Meta(ge=0, le=2**31 - 1)]
GpuIndex = Annotated[int, Meta(ge=0, le=1023)]
RankNo = Annotated[int, Meta(ge=0, le=2**31 - 1)]

# Which launcher runs a training rank, as the rank declares it (SDK <-> agent, messages.py).
Launcher = Literal["torchrun", "ft_launcher", "slurm", "none"]

# Discrete facts. Extending this list is a wire change: bump nothing, old agents keep
# working, but an old backend refuses the new kind with a clear 422. Each kind's data
# has its Struct in payloads.py (EVENT_DATA; the keys noted here are the main ones).
EventKind = Literal[
    "xid",  # an XID error on a GPU (data: xid, pci, pid, process, source=nvml|kmsg|injected)
    "gpu_lost",  # NVML_ERROR_GPU_IS_LOST on a device
    "rank_start",  # a training rank registered with the agent
    "rank_exit",  # a rank's process is gone (data: exit_code, signal)
    "exception",  # an exception reported by the SDK (message + traceback head)
    "hang",  # no step progress while heartbeats continue
    "heartbeat_lost",  # a rank stopped heartbeating
    "straggler",  # a rank flagged slow
    "checkpoint",  # checkpoint save/restore phases (data: phase, step, blocking_s)
    "restart",  # a restart observed (in-process iteration or launcher attempt)
    "command",  # command phases acked by the executor
    "spool_gap",  # the agent dropped data it could not deliver (data: samples, from, to)
    "agent_start",  # the agent process started (data: version, source)
    "timeouts",  # a job's timeouts break the timeout hierarchy (data: code, fix, values)
    "log",  # anything else worth showing in the feed
]


class GpuInfo(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    """Inventory of one GPU; sent in the first batch and whenever it changes."""

    uuid: Uuid
    index: GpuIndex
    name: Short = ""
    pci_bus_id: Short = ""
    memory_total_mib: NonNegF | None = None
    power_limit_w: NonNegF | None = None
    driver: Short = ""


class GpuSample(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    """GPU readings at one instant. A reading NVML could not give is None (missing).

    `gc=False` (here and on the other messages of scalars only): the cyclic collector
    does not track them. A backend process holds every in-flight batch's samples, 64 per
    batch: tracked, they were most of what each collection walked, and decoding a batch
    cost 138 us instead of 117 (docs/benchmarks.md)."""

    uuid: Uuid
    ts: SampleTs
    util: Pct | None = None  # DCGM_FI_DEV_GPU_UTIL
    mem_util: Pct | None = None  # DCGM_FI_DEV_MEM_COPY_UTIL
    mem_used_mib: NonNegF | None = None  # DCGM_FI_DEV_FB_USED
    mem_total_mib: NonNegF | None = None
    temp_c: Annotated[float, Meta(ge=-50, le=200)] | None = None  # DCGM_FI_DEV_GPU_TEMP
    mem_temp_c: Annotated[float, Meta(ge=-50, le=200)] | None = None
    power_w: NonNegF | None = None  # DCGM_FI_DEV_POWER_USAGE
    energy_mj: NonNegF | None = None  # DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION
    sm_clock_mhz: NonNegF | None = None  # DCGM_FI_DEV_SM_CLOCK
    mem_clock_mhz: NonNegF | None = None  # DCGM_FI_DEV_MEM_CLOCK
    clock_event_reasons: Count | None = None  # DCGM_FI_DEV_CLOCKS_EVENT_REASONS
    ecc_sbe_volatile: Count | None = None  # DCGM_FI_DEV_ECC_SBE_VOL_TOTAL
    ecc_dbe_volatile: Count | None = None  # DCGM_FI_DEV_ECC_DBE_VOL_TOTAL
    remapped_correctable: Count32 | None = None  # DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS
    remapped_uncorrectable: Count32 | None = None  # DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS
    remap_pending: bool | None = None
    remap_failure: bool | None = None  # DCGM_FI_DEV_ROW_REMAP_FAILURE
    pcie_replay: Count | None = None  # DCGM_FI_DEV_PCIE_REPLAY_COUNTER


Scalar = str | int | float | bool | None


class Event(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    kind: EventKind
    ts: Ts
    gpu_uuid: Uuid | None = None
    job: Name | None = None
    rank: RankNo | None = None
    xid: Annotated[int, Meta(ge=0, le=100000)] | None = None
    message: Text = ""
    # One Struct per kind in payloads.py (EVENT_DATA) types and bounds the known keys.
    data: Annotated[dict[Short, Scalar], Meta(max_length=64)] = {}

    def __post_init__(self) -> None:
        tp = EVENT_DATA.get(self.kind) if self.data else None
        if tp is not None:
            check_event_data(self.data, tp, self.kind)  # a ValueError becomes a ValidationError

    def typed_data(self) -> EventData:
        """`data` as its kind's Struct (payloads.py)."""
        return event_data(self.kind, self.data)


class StepReport(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    """One completed training step of one rank."""

    job: Name
    rank: RankNo
    step: NonNeg
    start: Ts
    end: Ts
    attempt: NonNeg = 0
    iteration: NonNeg = 0
    # Seconds of the rank's own work in the step (the SDK's `tg.compute()` sections),
    # without the wait in collectives: in synchronous training every rank's wall-clock
    # step is as slow as the slowest, so only this shows a straggler.
    compute: NonNegF | None = None


# Timeouts and intervals, in seconds. The bound refuses what no setting means (negative,
# infinite, or beyond 2**31 s, some 68 years); "no timeout" is an absent value.
MAX_TIMEOUT_S = float(2**31)
Seconds = Annotated[float, Meta(ge=0.0, le=MAX_TIMEOUT_S)]


class Timeouts(msgspec.Struct, omit_defaults=True, gc=False):
    """The timeouts that decide who acts first on a fault of one rank, as far as they are
    known (None: unknown, or no timeout). The SDK reads the rank's own; the agent adds
    trainguard's. The backend checks them against the order of docs/restarts.md ("Timeout
    hierarchy"). Unknown fields are ignored (not refused), so an agent that reports a
    timeout more keeps its batches accepted by this backend."""

    # torch.distributed's default process group: its collective timeout, and its backend.
    collective_s: Seconds | None = None
    collective_backend: Short | None = None
    # The longest blocking checkpoint save the rank measured so far (`tg.checkpoint`).
    checkpoint_save_s: Seconds | None = None
    # The launcher, from its command line and environment: ft_launcher's rank heartbeat
    # timeouts and check interval (NVRx FaultToleranceConfig), the worker monitor interval
    # of torchrun and ft_launcher (--monitor-interval).
    launcher_heartbeat_s: Seconds | None = None
    launcher_initial_heartbeat_s: Seconds | None = None
    launcher_check_interval_s: Seconds | None = None
    monitor_interval_s: Seconds | None = None
    # NVRx's inprocess.Wrapper running the rank.
    wrapper_soft_s: Seconds | None = None
    wrapper_hard_s: Seconds | None = None
    wrapper_heartbeat_s: Seconds | None = None
    wrapper_barrier_s: Seconds | None = None
    wrapper_completion_s: Seconds | None = None
    # trainguard's own, from the agent: the rank's hang threshold now (None until its pace
    # is known), the first-step allowance, and how long a launcher restart command waits
    # for the launcher to start new workers.
    hang_s: Seconds | None = None
    first_step_s: Seconds | None = None
    restart_wait_s: Seconds | None = None


class RankStatus(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    """The agent's view of one rank on its node, sent every batch."""

    job: Name
    rank: RankNo
    pid: Annotated[int, Meta(ge=0)]
    local_rank: RankNo = 0
    world_size: Annotated[int, Meta(ge=1, le=2**31 - 1)] = 1
    attempt: NonNeg = 0
    iteration: NonNeg = 0
    last_heartbeat: Ts | None = None
    last_step: NonNeg | None = None
    alive: bool = True
    # Declared by the rank through the SDK (None: unknown, an SDK from before them).
    in_process: bool | None = None  # True only when NVRx's inprocess.Wrapper runs it
    launcher: Launcher | None = None
    display_name: Name | None = None  # the job's readable name (script + short id)
    # The launcher's restart budget (torchrun/ft_launcher's --max-restarts) and the
    # restarts it has used, as the workers' environment says (None: unknown).
    max_restarts: Count32 | None = None
    restart_count: Count32 | None = None
    # The timeouts around the rank (Timeouts). Absent from older agents; an older backend
    # refuses a batch that has it (422), as with every RankStatus field added.
    timeouts: Timeouts | None = None


MAX_LAUNCHERS = 256
NodeCount = Annotated[int, Meta(ge=1, le=2**31 - 1)]
# What a launcher on the node does for its job: `active` (ranks of the job run under it
# here), `spare` (it never started workers: it waits in the rendezvous, beyond --nnodes
# MAX, as a hot spare), `restarting` (its workers are gone and it has not started new
# ones yet: between two rounds of the rendezvous).
LauncherState = Literal["active", "spare", "restarting"]


class LauncherStatus(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    """One torchrun or ft_launcher of a job on the agent's node (the job's shape: which
    nodes train, which wait as spares), as the agent reads it from /proc."""

    job: Name
    pid: Annotated[int, Meta(ge=1, le=2**31 - 1)]
    state: LauncherState
    launcher: Literal["torchrun", "ft_launcher"]
    min_nodes: NodeCount | None = None  # --nnodes MIN:MAX (N: both N); None: not given
    max_nodes: NodeCount | None = None
    ranks: Annotated[int, Meta(ge=0, le=MAX_RANKS)] = 0  # live ranks under it here
    started_at: Ts | None = None  # the process's start time


class Batch(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One POST /api/v1/ingest body.

    (node, agent_id, seq) identifies a batch: agent_id is random per agent process, seq
    counts up from 1 within it, so a replayed batch (a retry after a lost response, or a
    spooled batch sent twice) is stored once.
    """

    node: Name
    agent_id: Annotated[str, Meta(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9-]+$")]
    seq: Annotated[int, Meta(ge=1)]
    sent_at: Ts
    v: Literal[1] = 1
    simulated: bool = False
    gpus: Annotated[list[GpuInfo], Meta(max_length=MAX_GPUS)] | None = None
    samples: Annotated[list[GpuSample], Meta(max_length=MAX_SAMPLES)] = []
    events: Annotated[list[Event], Meta(max_length=MAX_EVENTS)] = []
    steps: Annotated[list[StepReport], Meta(max_length=MAX_STEPS)] = []
    ranks: Annotated[list[RankStatus], Meta(max_length=MAX_RANKS)] | None = None
    # The agent's last batch before a graceful stop (SIGTERM/SIGINT: an upgrade, systemctl
    # stop) says so, with the reason: its silence from then on is "agent_down", not a
    # node that died. Omitted otherwise, so old agents' batches are unchanged; an old
    # backend refuses this one batch (422) and the node reads "down" as before.
    going_away: Text | None = None
    # The job launchers on the node (LauncherStatus), sent when they change and every
    # half-minute; None: not in this batch (an old agent's, or unchanged), [] none runs.
    # An old backend refuses a batch with it (422).
    launchers: Annotated[list[LauncherStatus], Meta(max_length=MAX_LAUNCHERS)] | None = None


class IngestResult(msgspec.Struct):
    seq: int
    duplicate: bool
    stored_samples: int
    stored_events: int
    stored_steps: int
    received_at: float
    # The backend's pace for this agent: send batches no more often than this (samples
    # are still taken at the agent's own interval; urgent events still go at once).
    # Absent from older backends.
    batch_interval_s: float | None = None
    # True: this backend stores `Batch.launchers` (the agent sends them only then).
    launchers: bool | None = None


# --- commands: backend -> agent, over the agent's own connection -------------------------

Action = Literal["in_process", "launcher", "exclude_node", "stop_job"]
Phase = Literal["delivered", "torn_down", "restarted", "resumed", "failed"]
# An incident's timeline marks, in the order they happen (the API's `timeline`): the
# backend stores them, its invariants check their order, the operator client prints them.
TIMELINE = (
    "fault_at",
    "detected_at",
    "decided_at",
    "delivered_at",
    "torn_down_at",
    "restarted_at",
    "resumed_at",
)


class Command(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    id: Annotated[str, Meta(min_length=1, max_length=64)]
    job: Name
    action: Action
    node: Name
    issued_at: Ts
    incident_id: int | None = None
    reason: Short = ""
    params: dict[Short, Scalar] = {}  # typed and bounded by action in payloads.py

    def __post_init__(self) -> None:
        if self.params:
            command_params(self.action, self.params)

    def typed_params(self) -> CommandParams:
        return command_params(self.action, self.params)


class Ack(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    phase: Phase
    ts: Ts
    node: Name
    detail: Short = ""


_batch_decoder = msgspec.json.Decoder(Batch)
_encoder = msgspec.json.Encoder()

# Ingest bodies come in two encodings of the same messages, told apart by Content-Type:
# JSON (the default, readable with curl) and MessagePack (binary: the same fields, about
# a sixth fewer bytes and a fifth less decoding for a batch of float readings). A backend
# that takes MessagePack says so in every ingest answer's Accept-Post header.
JSON_TYPE = "application/json"
MSGPACK_TYPE = "application/msgpack"
MSGPACK_TYPES = (MSGPACK_TYPE, "application/x-msgpack", "application/vnd.msgpack")
_batch_msgpack_decoder = msgspec.msgpack.Decoder(Batch)
_msgpack_encoder = msgspec.msgpack.Encoder()


def decode_batch(body: bytes) -> Batch:
    """Decode and validate one ingest body; raises msgspec.ValidationError/DecodeError."""
    try:
        return _batch_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise join_path(exc) from None


def decode_batch_msgpack(body: bytes) -> Batch:
    """`decode_batch` for a MessagePack body (Content-Type: application/msgpack)."""
    try:
        return _batch_msgpack_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise join_path(exc) from None


_INNER_PATH = re.compile(r" - at `((?:data|params)[^`]*)` - at `(\$[^`]*)`$")


def join_path(exc: msgspec.ValidationError) -> msgspec.ValidationError:
    """One path for an error in an event's data (payloads.py): "... - at `data.pid` - at
    `$.events[3]`" reads "... - at `$.events[3].data.pid`"."""
    return msgspec.ValidationError(_INNER_PATH.sub(r" - at `\2.\1`", str(exc)))


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)


def encode_msgpack(obj: Any) -> bytes:
    return _msgpack_encoder.encode(obj)


def json_schema(tp: Any) -> dict[str, Any]:
    """JSON schema of a wire type, self-contained, for the backend's OpenAPI page.

    msgspec refers to `#/$defs/<name>`, which inside an OpenAPI document points at its
    root, where nothing is: the definitions are inlined (the wire types do not recurse)."""
    schema = msgspec.json.schema(tp)
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return walk(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {k: walk(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return dict(walk(schema))
