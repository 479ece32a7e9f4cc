"""Detection: which stored facts are evidence of a fault, and what each calls for.

An `Evidence` is an event row the agents sent (xid, gpu_lost, rank_exit, exception, hang,
heartbeat_lost) or a fact the engine observed itself (node_down: an agent gone silent).
`classify` maps it, through the policy, to a `Verdict`: the cause in words, the action it
calls for, and whether it concerns one job (the event names it) or every job with live
ranks on a node (an XID, a lost GPU, a silent node).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainguard.backend.engine.policy import RECOVERY_ACTIONS, Policy
from trainguard.protocol.xid import describe_xid

# Event kinds the engine reads; the rest (samples, steps, logs) never wake it.
EVIDENCE_KINDS = frozenset({"xid", "gpu_lost", "rank_exit", "exception", "hang", "heartbeat_lost"})
JOB_CAUSES = ("exception", "hang", "rank_exit", "heartbeat_lost")
# XID buckets that do not make the GPU suspect (the application's fault, or harmless).
SOFT_BUCKETS = frozenset({"RESTART_APP", "IGNORE", "UNKNOWN"})


@dataclass
class Evidence:
    kind: str
    ts: float  # the observing machine's clock
    received_at: float  # the backend's clock
    node_id: int | None
    node: str | None = None
    job: str | None = None
    rank: int | None = None
    xid: int | None = None
    gpu_uuid: str | None = None
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    event_id: int | None = None
    clock_offset_s: float | None = None  # the node's clock minus the backend's


@dataclass(frozen=True)
class Verdict:
    cause: str  # "xid 79", "exception", "node_down", ...
    action: str  # one of the policy's action names
    why: str  # which policy entry decided it
    node_scoped: bool  # True: every job with live ranks on the node is concerned
    hard: bool = False  # a hard XID (counts towards excluding the node)
    step: int | None = None  # the training step at the fault, when the evidence says

    @property
    def hardware(self) -> bool:
        """Evidence about the node's hardware or reachability: the only kind that may
        cordon a node (a hard XID, a lost GPU, NVML's recovery action, a silent node)."""
        return self.cause == "node_down" or (self.node_scoped and self.hard)


def as_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().isdigit():
        return int(v.strip())
    return None


def recovery_action(data: dict[str, Any]) -> int | None:
    """NVML's recovery action from event data: a number (0-4) or its name."""
    v = data.get("recovery_action")
    if isinstance(v, str) and not v.strip().isdigit():
        name = v.strip().upper().removeprefix("NVML_GPU_RECOVERY_ACTION_")
        return next((k for k, n in RECOVERY_ACTIONS.items() if n == name), None)
    return as_int(v)


def classify(ev: Evidence, policy: Policy) -> Verdict | None:
    """The verdict on one piece of evidence, or None when it is no fault at all."""
    if ev.kind in ("xid", "gpu_lost"):
        code = ev.xid if ev.xid is not None else 79 if ev.kind == "gpu_lost" else None
        if code is None:
            return None
        info = describe_xid(code)
        bucket = info.action
        if bucket == "UNKNOWN" and isinstance(ev.data.get("action"), str):
            bucket = str(ev.data["action"])  # a newer agent may know the code
        action, why = policy.xid_action(code, bucket, recovery_action(ev.data))
        if ev.kind == "gpu_lost" and not why.startswith("NVML"):
            action, why = policy.cause("gpu_lost"), "policy causes.gpu_lost"
        cause = "gpu_lost" if ev.kind == "gpu_lost" else f"xid {code}"
        hard = (
            ev.kind == "gpu_lost"
            or bucket not in SOFT_BUCKETS
            or (why.startswith("NVML") and action in ("exclude_node", "reset_gpu"))
        )
        return Verdict(cause, action, why, node_scoped=True, hard=hard)
    if ev.kind == "node_down":
        return Verdict("node_down", policy.cause("node_down"), "policy causes.node_down", True)
    if ev.kind in JOB_CAUSES:
        if ev.job is None:
            return None
        if ev.kind == "rank_exit" and (clean_exit(ev.data) or stopped(ev.data)):
            return None  # a rank that finished its work, or was stopped, is no fault
        step = as_int(ev.data.get("step"))
        if step is None:
            step = as_int(ev.data.get("last_step"))
        return Verdict(
            ev.kind, policy.cause(ev.kind), f"policy causes.{ev.kind}", node_scoped=False, step=step
        )
    return None


def clean_exit(data: dict[str, Any]) -> bool:
    """A rank that ended its work: exit code 0 (or none known) and not said unclean. An
    exit code other than 0, a signal or an uncaught exception is never clean, whatever
    else the report says."""
    code = data.get("exit_code")
    if data.get("signal") not in (None, 0, "") or data.get("clean") is False:
        return False  # killed, or the agent saw it die unclean (an uncaught exception)
    if code not in (None, 0):
        return False
    return data.get("clean") is True or code == 0


def stopped(data: dict[str, Any]) -> str | None:
    """How a rank was stopped rather than failed, from its rank_exit: "trainguard" (the
    agent ended its launcher for stop_job, or for exclude_node: its node left the job),
    "outside" (a stop signal, SIGTERM or SIGINT, that its launcher got and passed on, then
    exited: its user's kill, Ctrl-C, scancel, a deleted pod), else None. A stop signal
    whose launcher lives on is a worker killed under a running launcher: that is a fault
    like any other.

    An exit whose status the agent could not read because the launcher reaped it first
    (`reaped`, with nothing uncaught) and whose launcher then exited reads the same way: a
    launcher reaps at once only the workers it ends itself, with the same stop signal."""
    by = data.get("signalled_by")
    if isinstance(by, str) and by.startswith(("stop_job", "exclude_node")):
        return "trainguard"
    stop = data.get("stop_signal") not in (None, 0, "")
    unread = data.get("reaped") is True and not data.get("uncaught")
    if (stop or unread) and data.get("launcher_exited") is True:
        return "outside" if by is None else None
    return None


def hardware_evidence(kind: str, xid: int | None, action: str) -> bool:
    """The same judgement as Verdict.hardware, from a stored evidence row."""
    if kind in ("gpu_lost", "node_down"):
        return True
    if kind != "xid" or xid is None:
        return False
    return describe_xid(xid).action not in SOFT_BUCKETS or action in ("exclude_node", "reset_gpu")


def describe(ev: Evidence) -> str:
    """One line for the incident's evidence list."""
    who = f"rank {ev.rank}" if ev.rank is not None else ""
    where = f"on {ev.node}" if ev.node else ""
    text = ev.message.splitlines()[0] if ev.message else ev.kind
    return " ".join(p for p in (text[:300], who, where) if p)
