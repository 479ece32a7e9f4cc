"""The warm pool's messages (agent/worker/, docs/restarts.md "The warm pool"): one JSON
object per SOCK_SEQPACKET datagram, tagged by "t".

- shim -> pool: `Run` (the worker to start, with the shim's fds 0-2 attached), or the
  supervisor's `StatsRequest`;
- pool -> shim: `Refused` or `Busy` (the shim runs the script itself), or, from the warm
  interpreter the pool handed the request to, `Started`; later, from the pool, `Exit`;
- shim -> warm interpreter: `Go` (committed: the worker runs there);
- pool -> supervisor: `Stats`.

Each side decodes what it may receive with one decoder (`decode_*`); a datagram that is
not valid JSON, is not one of the expected messages or breaks a bound is a `PoolError`
(a ValueError), which the receiver treats as a closed connection or a failed request.
"""

from __future__ import annotations

from typing import Annotated, TypeVar

import msgspec
from msgspec import Meta, Struct

# Bounds: a datagram is at most 1 MiB (the receivers' buffer).
Pid = Annotated[int, Meta(ge=1, le=2**31 - 1)]
Count = Annotated[int, Meta(ge=0, le=2**31 - 1)]
Why = Annotated[str, Meta(max_length=2000)]


T = TypeVar("T")


class PoolError(ValueError):
    """A datagram that is not the message the receiver expects."""


class Interpreter(Struct, forbid_unknown_fields=True):
    """What a warm interpreter must share with the worker's to stand in for it."""

    prefix: str
    executable: str
    version: int
    flags: list[int | bool]
    hashseed: str = ""


class Run(Struct, tag="run", tag_field="t", forbid_unknown_fields=True):
    argv: Annotated[list[str], Meta(min_length=1)]
    env: dict[str, str]
    cwd: str
    ppid: Count
    python: Interpreter
    unbuffered: bool = False
    fds: Annotated[list[Annotated[int, Meta(ge=0, le=2)]], Meta(max_length=3)] = msgspec.field(
        default_factory=lambda: [0, 1, 2]
    )


class StatsRequest(Struct, tag="stats", tag_field="t", forbid_unknown_fields=True):
    pass


class Refused(Struct, tag="refused", tag_field="t", forbid_unknown_fields=True):
    why: Why


class Busy(Struct, tag="busy", tag_field="t", forbid_unknown_fields=True):
    why: Why


class Started(Struct, tag="started", tag_field="t", forbid_unknown_fields=True):
    pid: Pid


class Go(Struct, tag="go", tag_field="t", forbid_unknown_fields=True):
    pass


class Exit(Struct, tag="exit", tag_field="t", forbid_unknown_fields=True):
    """How the worker ended: its exit code, or the signal that ended it."""

    pid: Pid
    code: Annotated[int, Meta(ge=0, le=255)] | None = None
    signal: Annotated[int, Meta(ge=1, le=127)] | None = None


class Stats(Struct, tag="stats", tag_field="t", forbid_unknown_fields=True):
    pid: Pid
    size: Count
    idle: list[int]
    busy: list[int]
    served: Count
    busy_answers: Count
    refused: Count
    preloaded: list[str]


ToPool = Run | StatsRequest
ToShim = Refused | Busy | Started | Exit

_encoder = msgspec.json.Encoder()
_to_pool: msgspec.json.Decoder[ToPool] = msgspec.json.Decoder(ToPool)
_to_shim: msgspec.json.Decoder[ToShim] = msgspec.json.Decoder(ToShim)
_go = msgspec.json.Decoder(Go)
_stats = msgspec.json.Decoder(Stats)


def encode(msg: Struct) -> bytes:
    return _encoder.encode(msg)


def _decode(decoder: msgspec.json.Decoder[T], data: bytes) -> T:
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise PoolError(f"not a warm pool message: {exc}") from None


def decode_to_pool(data: bytes) -> ToPool:
    return _decode(_to_pool, data)


def decode_to_shim(data: bytes) -> ToShim:
    return _decode(_to_shim, data)


def decode_go(data: bytes) -> Go:
    return _decode(_go, data)


def decode_stats(data: bytes) -> Stats:
    return _decode(_stats, data)
