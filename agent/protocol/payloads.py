"""What `Event.data` and `Command.params` (wire.py) hold: one Struct per event kind and
one per command action, with the bounds of each field.

On the wire both stay JSON objects of scalars (`dict[Short, Scalar]`), so the same JSON
goes over the wire as before. `Event` and `Command` check their `data`/`params` against
the kind's (the action's) Struct when they are made or decoded, so a wrongly typed or
out-of-bounds field is refused with the same 422 as any other field, naming it:
"Expected `int` >= 0, in rank_exit data - at `$.events[3].data.pid`".

The rule for keys, the same for every kind and action:
- a key listed here must have its type and bounds; null is the same as absent;
- a key not listed here is let through as before (a scalar under a key of at most 256
  characters, at most 64 keys): a newer agent may add a key, and an older backend must
  not refuse the whole batch over it (nor an older agent a command over a new param);
- `log` events carry what a training script logged (the SDK's `Log.data`): no key of
  theirs is typed.
Bounds are those the producer already keeps (a pid is >= 0, a phase the agent cuts to
64 characters); a value that comes from a training script through the SDK is typed but
not narrowed further than the SDK's own message (a checkpoint's step is any int), so an
existing agent's batches still decode, and the agent cannot fail to make an event from
what a rank said.

Adding an event kind: its Struct here and its entry in EVENT_DATA (a kind with no entry
has free-form data). Adding a command action: nothing here if it takes only the common
params; else one Struct decorated with `@params_for("<action>")`.

This module imports nothing of trainguard (wire.py imports it), so it keeps bounds of its
own, the same as wire.py's where they share a name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta, field

Short = Annotated[str, Meta(max_length=256)]
Text = Annotated[str, Meta(max_length=4096)]
Ts = Annotated[float, Meta(ge=0.0, le=1e11)]
NonNegF = Annotated[float, Meta(ge=0.0)]
Count = Annotated[int, Meta(ge=0, le=2**63 - 1)]
# What a rank said through the SDK (attempt, step, pid) is bounded as the SDK's message
# bounds it (messages.py, RankStatus): >= 0 with no upper bound, so the agent cannot fail
# to make an event of any value it took from a rank.
NonNeg = Annotated[int, Meta(ge=0)]
Pid = NonNeg
Signal = Annotated[int, Meta(ge=0, le=255)]
Id64 = Annotated[str, Meta(max_length=64)]

# --- Event.data, by kind --------------------------------------------------------------------


class EventData(msgspec.Struct, omit_defaults=True, gc=False):
    """The fields every kind's data may have (none); a key not listed is let through."""

    def wire(self) -> dict[str, Any]:
        """The JSON object for `Event.data` (absent fields left out)."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


class XidData(EventData):
    """An XID (also the XID-based `gpu_lost`): where it was read and what else is known."""

    source: Short | None = None  # nvml | kmsg | injected
    action: Short | None = None  # the catalog's bucket (RESTART_APP, RESET_GPU, ...)
    # NVML's recovery action for the fault: its number or its name (NODE_REBOOT, ...)
    recovery_action: Annotated[int, Meta(ge=0, le=255)] | Short | None = None
    pci: Short | None = None  # normalised bus id, 0000:18:00
    pid: Pid | None = None  # the process the kernel log names
    process: Text | None = None
    gpu_instance: NonNeg | None = None  # MIG instances (a kernel log's digits)
    compute_instance: NonNeg | None = None


class GpuLostData(XidData):
    """A GPU that fell off the bus (an XID 79 by NVML), or unreadable at agent start."""

    index: Annotated[int, Meta(ge=0, le=1023)] | None = None
    reason: Short | None = None


class RankStartData(EventData):
    pid: Pid | None = None
    local_rank: Annotated[int, Meta(ge=0, le=2**31 - 1)] | None = None
    world_size: Annotated[int, Meta(ge=1, le=2**31 - 1)] | None = None
    attempt: NonNeg | None = None
    iteration: NonNeg | None = None
    launcher: Short | None = None
    in_process: bool | None = None
    display_name: Short | None = None


class RankExitData(EventData):
    pid: Pid | None = None
    exit_code: int | None = None  # the exit status, or what the rank said (sys.exit)
    signal: Signal | None = None  # the signal that ended it
    clean: bool | None = None
    uncaught: Short | None = None  # the type of an exception nothing caught
    last_step: NonNeg | None = None
    stop_signal: Signal | None = None  # SIGINT/SIGTERM, as its exit shows
    signalled_by: Short | None = None  # "stop_job <command>", "launcher restart <command>"
    reaped: bool | None = None  # its launcher reaped it before the agent read its status
    launcher_exited: bool | None = None


class ExceptionData(EventData):
    type: Short | None = None
    step: int | None = None
    pid: Pid | None = None
    uncaught: bool | None = None
    thread: Short | None = None


class HangData(EventData):
    pid: Pid | None = None
    last_step: NonNeg | None = None
    stalled_s: NonNegF | None = None
    threshold_s: NonNegF | None = None


class HeartbeatLostData(EventData):
    pid: Pid | None = None
    age_s: NonNegF | None = None


class StragglerData(EventData):
    """The backend's own straggler rows have these; an agent sends none today."""

    scope: Short | None = None  # rank | node
    flagged: bool | None = None
    ranks: Count | None = None
    score: float | None = None
    relative_score: float | None = None
    individual_score: float | None = None
    median_step_s: NonNegF | None = None
    reference_step_s: NonNegF | None = None
    threshold: float | None = None
    windows: Count | None = None
    attempt: NonNeg | None = None
    iteration: NonNeg | None = None
    reason: Short | None = None


class CheckpointData(EventData):
    phase: Annotated[str, Meta(max_length=64)] | None = None  # save_start, save_end, ...
    step: int | None = None
    blocking_s: float | None = None  # the rank's clock: not narrowed
    ok: bool | None = None


class RestartData(EventData):
    level: Short | None = None  # in_process | launcher
    attempt: NonNeg | None = None
    iteration: NonNeg | None = None
    previous: NonNeg | None = None  # the iteration before an in-process restart
    phase: Short | None = None  # "raised": a rank raised the agent's request
    request: Id64 | None = None


class TimeoutsData(EventData):
    """The backend's own rows (backend/jobs/timeouts.py): a rule of the timeout hierarchy
    the job breaks; no agent sends one today."""

    code: Short | None = None
    fix: Text | None = None
    shorter_s: float | None = None
    longer_s: float | None = None


class CommandEventData(EventData):
    """No agent sends these today; the live feed's command phases read the same."""

    command_id: Id64 | None = None
    phase: Short | None = None


class SpoolGapData(EventData):
    """What the agent dropped: from its spool (a range of batches) or its outbox."""

    records: Count | None = None
    where: Short | None = None  # "outbox"
    samples: Count | None = None
    events: Count | None = None
    steps: Count | None = None
    batches: Count | None = None
    start: Ts | None = field(default=None, name="from")
    end: Ts | None = field(default=None, name="to")


class AgentStartData(EventData):
    version: Short | None = None
    source: Short | None = None  # nvml | simulated
    agent_id: Id64 | None = None
    pid: Pid | None = None
    interval: NonNegF | None = None


# The Struct of each kind's data; a kind not here (log) has free-form data.
EVENT_DATA: dict[str, type[EventData]] = {
    "xid": XidData,
    "gpu_lost": GpuLostData,
    "rank_start": RankStartData,
    "rank_exit": RankExitData,
    "exception": ExceptionData,
    "hang": HangData,
    "heartbeat_lost": HeartbeatLostData,
    "straggler": StragglerData,
    "checkpoint": CheckpointData,
    "restart": RestartData,
    "command": CommandEventData,
    "spool_gap": SpoolGapData,
    "agent_start": AgentStartData,
    "timeouts": TimeoutsData,
}


# --- Command.params, by action --------------------------------------------------------------


class CommandParams(msgspec.Struct, omit_defaults=True, gc=False):
    """What every command may carry: the job's ranks on the node and, for an automatic
    action, the fault's generation (an agent acks a restart that happened since as
    served). A key not listed is let through."""

    # The job's ranks on the node, "0,1" (params are scalars).
    ranks: Annotated[str, Meta(max_length=65536, pattern=r"^(\d+(,\d+)*)?$")] | None = None
    cause: Id64 | None = None
    fault_at: Ts | None = None
    attempt: NonNeg | None = None
    iteration: NonNeg | None = None

    def wire(self) -> dict[str, Any]:
        """The JSON object for `Command.params` (absent fields left out)."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


# The Struct of each action's params; an action not here takes CommandParams.
COMMAND_PARAMS: dict[str, type[CommandParams]] = {}
P = TypeVar("P", bound=type[CommandParams])


def params_for(action: str) -> Callable[[P], P]:
    """Register a Struct as the params of `action` (one decorator per action)."""

    def register(cls: P) -> P:
        COMMAND_PARAMS[action] = cls
        return cls

    return register


@params_for("launcher")
class LauncherParams(CommandParams):
    grace_s: NonNegF | None = None  # SIGTERM to SIGKILL of the workers (agent's default)


@params_for("stop_job")
class StopJobParams(CommandParams):
    timeout_s: NonNegF | None = None  # how long the launcher has to exit


@params_for("exclude_node")
class ExcludeNodeParams(CommandParams):
    grace_s: NonNegF | None = None  # SIGTERM to SIGKILL of the node's launcher (policy)


# --- checks ---------------------------------------------------------------------------------


def event_data(kind: str, data: dict[str, Any]) -> EventData:
    """`data` of a `kind` event as its Struct (EventData for free-form kinds); raises
    ValueError naming the field (`data.<key>`) and the kind."""
    return _convert(data, EVENT_DATA.get(kind, EventData), f"{kind} data", "data")


def command_params(action: str, params: dict[str, Any]) -> CommandParams:
    """`params` of an `action` command as its Struct; raises ValueError naming the field."""
    tp = COMMAND_PARAMS.get(action, CommandParams)
    return _convert(params, tp, f"{action} params", "params")


def check_event_data(data: dict[str, Any], tp: type[EventData], kind: str) -> None:
    """`event_data` for Event.__post_init__, on every event decoded: the fast path."""
    try:
        msgspec.convert(data, tp)
    except msgspec.ValidationError:
        _convert(data, tp, f"{kind} data", "data")


T = TypeVar("T")


def _convert(obj: dict[str, Any], tp: type[T], what: str, where: str) -> T:
    try:
        return msgspec.convert(obj, tp)
    except msgspec.ValidationError as exc:
        # "Expected `int` >= 0 - at `$.pid`" -> "Expected `int` >= 0, in hang data -
        # at `data.pid`"; msgspec adds the path to the event (wire.join_path joins them).
        text, _, path = str(exc).partition(" - at `$")
        raise ValueError(f"{text}, in {what} - at `{where}{path or '`'}") from None
