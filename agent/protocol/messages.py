"""The datagrams between a training rank (the SDK) and its node's agent, defined once.

Each datagram is one JSON object of a tagged union: `"t"` names the message, `"version"`
the protocol version. The SDK encodes these Structs (`encode`); the agent decodes every
datagram with one decoder (`decode_from_sdk`) into a typed message and dispatches on its
type; the SDK decodes the agent's answers the same way (`decode_from_agent`).

Versions. PROTOCOL_VERSION changes only when a receiver of the previous version would
misread a message; a new optional field or a new message type keeps it (a receiver
ignores fields it does not know and refuses a type it does not know as malformed).
Version 1 is also what SDKs sent before these Structs existed (no `"version"` key, which
reads as 1): an agent upgraded under running jobs keeps understanding their ranks.

Size. One datagram carries at most MAX_DATAGRAM bytes (the agent reads no more); the SDK
sends steps in chunks of STEPS_PER_DATAGRAM, halved while one would not fit.

Field names are the wire's keys, except where a Python name reads better than the key
the first SDKs used (`msgspec.field(name=...)`: `Steps.steps` is `"v"`, `request_id` is
`"id"`, `ExceptionReport.exc_type` is `"type"`).
"""

from __future__ import annotations

import numbers
from typing import Annotated, Any, TypeVar, get_args

import msgspec
from msgspec import UNSET, Meta, UnsetType, field

from trainguard.protocol.wire import Launcher, NonNeg, RankNo, Ts

PROTOCOL_VERSION = 1
MAX_DATAGRAM = 65536  # bytes
STEPS_PER_DATAGRAM = 1000
LAUNCHERS: tuple[str, ...] = get_args(Launcher)

Pid = Annotated[int, Meta(ge=0)]
WorldSize = Annotated[int, Meta(ge=1, le=2**31 - 1)]
XidCode = Annotated[int, Meta(ge=0, le=100000)]


class Message(msgspec.Struct, kw_only=True, tag_field="t"):
    """Every datagram, either way."""

    version: int = PROTOCOL_VERSION


# --- SDK -> agent: who the rank is ------------------------------------------------------


class Identity(Message):
    """Who the rank is and what it declared; the agent registers a rank from any of
    these (a rank that attached before the agent started is known at its heartbeat)."""

    job: str
    rank: RankNo
    pid: Pid
    local_rank: RankNo = 0
    world_size: WorldSize = 1
    attempt: NonNeg = 0
    iteration: NonNeg = 0  # the Wrapper's restart iteration
    ppid: Pid = 0
    last_step: int | None = None
    dropped: NonNeg = 0  # datagrams the SDK could not send so far
    ts: Ts | None = None
    # Declared by the rank; UNSET (absent): an SDK from before declarations, unknown. The
    # agent keeps a value the HTTP wire accepts and drops another (a launcher not in
    # LAUNCHERS, a display name that is no wire Name, an in_process that is no bool), so
    # one odd rank cannot get its node's batches refused: hence no stricter types here.
    display_name: str | UnsetType | None = UNSET
    launcher: str | UnsetType | None = UNSET
    in_process: Any = UNSET
    # The launcher's restart budget as it put it in the worker's environment
    # (TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RESTART_COUNT); None: no such launcher.
    max_restarts: Any = UNSET
    restart_count: Any = UNSET
    # The timeouts the rank can read (seconds by the field names of wire.Timeouts: its
    # process group's, its launcher's, its Wrapper's, its longest checkpoint save); the
    # agent keeps each value the HTTP wire accepts and drops another.
    timeouts: Any = UNSET


class Hello(Identity, tag="hello"):
    """Sent at attach, and when the SDK finds an agent it had not reached."""


class Heartbeat(Identity, tag="heartbeat"):
    """Sent every heartbeat interval: the rank is alive."""


class Iteration(Identity, tag="iteration"):
    """Sent when NVRx's Wrapper starts a new restart iteration of the training function."""


class Bye(Identity, tag="bye"):
    """Sent at exit. `clean`: as far as the SDK knows (the agent also reads the exit
    status); None from an SDK before capabilities, whose bye meant a clean exit."""

    clean: bool | None = None
    uncaught: str | None = None  # the type of an exception nothing caught
    exit_code: int | None = None  # as sys.exit() or a SystemExit out of a step said


# --- SDK -> agent: what the rank does ---------------------------------------------------


class StepTiming(msgspec.Struct, array_like=True):
    """One completed step, `[step, start, end, compute]` on the wire (compute null or
    absent: not measured)."""

    step: NonNeg
    start: Ts
    end: Ts
    compute: float | None = None  # seconds of the rank's own work in the step


class Steps(Message, tag="steps"):
    """Completed steps, in order (the SDK queues them and sends them off the training
    thread)."""

    steps: list[StepTiming] = field(name="v")


class Interrupted(Message, tag="interrupted"):
    """The training function is torn down for a restart it did not cause."""

    reason: str = ""
    step: int | None = None
    ts: Ts | None = None


class ExceptionReport(Message, tag="exception"):
    """An exception that left a step or that nothing caught."""

    exc_type: str = field(name="type")
    message: str = ""
    traceback: str = ""  # its last lines
    step: int | None = None
    uncaught: bool = False
    thread: str | None = None  # the thread nothing caught it in (None: the main thread)
    ts: Ts | None = None


class Checkpoint(Message, tag="checkpoint"):
    """A checkpoint phase: `<phase>_start`, then `<phase>_end` with its blocking time."""

    phase: str
    step: int | None = None
    blocking_s: float | None = None
    ok: bool | None = None
    ts: Ts | None = None


class RestartReceived(Message, tag="restart_received"):
    """The rank got the agent's restart request `request_id`."""

    request_id: str = field(default="", name="id")
    ts: Ts | None = None


class RestartRaised(Message, tag="restart_raised"):
    """The rank raised RestartRequested for request `request_id`."""

    request_id: str = field(default="", name="id")
    ts: Ts | None = None


class Finished(Message, tag="finished"):
    """No more steps will come (no more hang checks)."""

    step: int | None = None
    ts: Ts | None = None


class Log(Message, tag="log"):
    """A line for the feed; `data`'s scalar values travel with it."""

    message: str = ""
    data: dict[str, Any] = {}
    ts: Ts | None = None


class InjectXid(Message, tag="inject_xid"):
    """Fault injection: a simulated XID on a simulated GPU of the agent."""

    xid: XidCode
    gpu: NonNeg = 0
    message: str = ""
    ts: Ts | None = None


FromSdk = (
    Hello
    | Heartbeat
    | Iteration
    | Bye
    | Steps
    | Interrupted
    | ExceptionReport
    | Checkpoint
    | RestartReceived
    | RestartRaised
    | Finished
    | Log
    | InjectXid
)


# --- agent -> SDK -----------------------------------------------------------------------


class Restart(Message, tag="restart"):
    """An in-process restart request for the ranks of `job` (None: whatever job)."""

    job: str | None = None
    request_id: str = field(default="", name="id")
    reason: str = ""


FromAgent = Restart


# --- encoding and decoding --------------------------------------------------------------


class Rejected(ValueError):
    """A datagram the receiver cannot use. `reason`: "version" (another protocol
    version) or "malformed" (not JSON, an unknown message type, a missing or mistyped
    field); `detail` says what, in a few words."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


M = TypeVar("M", bound=Message)


class _Envelope(msgspec.Struct):
    version: int = PROTOCOL_VERSION


def _number(obj: Any) -> Any:
    """A number of another library (numpy's int64, a one-element torch tensor) as a
    Python number: a training script passes what it has as a step number."""
    if isinstance(obj, numbers.Integral):
        return int(obj)
    if isinstance(obj, numbers.Real):
        return float(obj)
    item = getattr(obj, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"cannot send a {type(obj).__name__} to the agent")


encode = msgspec.json.Encoder(enc_hook=_number).encode
_from_sdk = msgspec.json.Decoder(FromSdk)
_from_agent = msgspec.json.Decoder(FromAgent)
_envelope = msgspec.json.Decoder(_Envelope)


def decode_from_sdk(data: bytes) -> FromSdk:
    """One datagram from a rank; Rejected when it is of another version or malformed."""
    return _decode(_from_sdk, data)


def decode_from_agent(data: bytes) -> FromAgent:
    """One datagram from the agent; Rejected when it is of another version or malformed."""
    return _decode(_from_agent, data)


def _decode(decoder: msgspec.json.Decoder[M], data: bytes) -> M:
    try:
        msg = decoder.decode(data)
    except msgspec.MsgspecError as exc:
        version = _version(data)
        if version is not None and version != PROTOCOL_VERSION:
            raise Rejected(
                "version", f"version {version}, this side speaks {PROTOCOL_VERSION}"
            ) from None
        raise Rejected("malformed", str(exc)[:200]) from None
    if msg.version != PROTOCOL_VERSION:
        raise Rejected("version", f"version {msg.version}, this side speaks {PROTOCOL_VERSION}")
    return msg


def _version(data: bytes) -> int | None:
    """The version a datagram says it is of, when it is an object with an int version."""
    try:
        return _envelope.decode(data).version
    except msgspec.MsgspecError:
        return None
