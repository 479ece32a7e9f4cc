"""What the operator API answers, typed: the fields of an incident, a node's cordon state,
and the one error every call raises (the HTTP status with the server's `detail`).

Fields the server adds later are ignored when decoding; the CLI shows these."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from trainguard.protocol.wire import TIMELINE

DEFAULT_SERVER = "http://127.0.0.1:8000"
# The levels POST /jobs/{job}/restarts accepts (to exclude a node: cordon it, then restart).
RestartLevel = Literal["in_process", "launcher"]


class ClientError(Exception):
    """A call that did not succeed. `status` is the HTTP status, or None when no answer
    came (the server is unreachable, or it answered something that is not the API)."""

    def __init__(self, status: int | None, detail: str) -> None:
        super().__init__(detail if status is None else f"{detail} (HTTP {status})")
        self.status = status
        self.detail = detail


class Timeline(msgspec.Struct, kw_only=True):
    fault_at: float | None = None
    detected_at: float | None = None
    decided_at: float | None = None
    delivered_at: float | None = None
    torn_down_at: float | None = None
    restarted_at: float | None = None
    resumed_at: float | None = None

    def marks(self) -> list[tuple[str, float]]:
        """The marks present, as (name without `_at`, time), in timeline order."""
        return [(f.removesuffix("_at"), t) for f in TIMELINE if (t := getattr(self, f)) is not None]


class Decision(msgspec.Struct, kw_only=True):
    at: float | None = None
    level: str | None = None
    why: str | None = None
    by: str | None = None
    mode: str | None = None


class Evidence(msgspec.Struct, kw_only=True):
    kind: str
    ts: float | None = None
    cause: str | None = None
    action: str | None = None
    node: str | None = None
    rank: int | None = None
    xid: int | None = None


class Ack(msgspec.Struct, kw_only=True):
    phase: str
    ts: float
    detail: Any = None


class Command(msgspec.Struct, kw_only=True):
    id: str
    node: str | None = None
    action: str | None = None
    issued_at: float | None = None
    delivered_at: float | None = None
    acks: list[Ack] = msgspec.field(default_factory=list)


class Incident(msgspec.Struct, kw_only=True):
    id: int
    status: str
    job: str | None = None
    job_state: str | None = None
    created_at: float | None = None
    trigger: str | None = None
    triggered_by: str | None = None
    cause: str | None = None
    level: str | None = None
    reason: str | None = None
    outcome: str | None = None
    node: str | None = None
    gpu_uuid: str | None = None
    xid: int | None = None
    lost_steps: int | None = None
    closed_at: float | None = None
    recovery_s: float | None = None
    timeline: Timeline = msgspec.field(default_factory=Timeline)
    decisions: list[Decision] = msgspec.field(default_factory=list)
    evidence: list[Evidence] = msgspec.field(default_factory=list)
    commands: list[Command] = msgspec.field(default_factory=list)


class NodeCordon(msgspec.Struct, kw_only=True):
    """The answer to cordon / uncordon: the node, whether it is cordoned now, and whether
    the request changed that (absent from older servers: taken as changed)."""

    name: str
    cordoned: bool
    changed: bool = True
    incidents: list[int] = []  # one per job the node left (a forced cordon)
