"""How the replay's commands are acked (docs/replay.md, "The ack model").

No agent answers a replay. A command the replay issues is acked:

1. as the recorded command of the same incident (same job and fault time), action and
   node was: its recorded phases, details and delays after its issue (the self-check
   under the policy in force finds every one);
2. otherwise with the phases that most recorded commands of that action had, each after
   the median delay measured for that action and phase in this trace;
3. with no recorded command of that action: DEFAULT_DELAYS.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any, get_args

import msgspec
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from trainguard.backend.models import Command, Incident, Job
from trainguard.backend.replay.trace import Trace
from trainguard.protocol import wire

# Seconds after the command was issued (measured here: docs/restarts.md, in-process
# 1.2-1.9 s, launcher 5.4-5.9 s from the kill to the next step).
DEFAULT_DELAYS: dict[str, dict[str, float]] = {
    "in_process": {"delivered": 0.05, "torn_down": 0.5, "restarted": 1.0, "resumed": 2.0},
    "launcher": {"delivered": 0.05, "torn_down": 1.0, "restarted": 3.0, "resumed": 6.0},
    "exclude_node": {"delivered": 0.05, "torn_down": 1.0},
    "stop_job": {"delivered": 0.05, "torn_down": 1.0},
}
DEFAULT_DELAYS["reset_gpu"] = DEFAULT_DELAYS["launcher"]
_Acked = tuple[str, float, str, float]
# Two acks of one instant go in the order a command passes its phases.
_ORDER = {p: i for i, p in enumerate(get_args(wire.Phase))}


class AckModel:
    def __init__(self, trace: Trace) -> None:
        incs = {i["id"]: i for i in trace["incident"]}
        by_cmd: dict[str, list[dict[str, Any]]] = {}
        for a in trace["ack"]:
            by_cmd.setdefault(a["command"], []).append(a)
        # (phase, ts - issued, detail, received - issued) of each recorded ack
        self.recorded: dict[tuple[str, float, str, str], list[list[_Acked]]] = {}
        delays: dict[tuple[str, str], list[float]] = {}
        phase_sets: dict[str, Counter[tuple[str, ...]]] = {}
        for c in sorted(trace["command"], key=lambda c: (c["issued_at"], c["id"])):
            inc = incs.get(c["incident"])
            got = sorted(
                by_cmd.get(c["id"], []), key=lambda a: (a["ts"], _ORDER.get(a["phase"], 9))
            )
            acks = [
                (
                    a["phase"],
                    a["ts"] - c["issued_at"],
                    a["detail"] or "",
                    (a.get("received_at") or a["ts"]) - c["issued_at"],
                )
                for a in got
            ]
            if inc is not None:
                key = (inc["job"], inc["fault_at"] or 0.0, c["action"], c["node"])
                self.recorded.setdefault(key, []).append(acks)
            for phase, delay, _, _ in acks:
                if phase != "failed":
                    delays.setdefault((c["action"], phase), []).append(delay)
            phase_sets.setdefault(c["action"], Counter())[tuple(a[0] for a in acks)] += 1
        self.medians = {k: statistics.median(v) for k, v in delays.items()}
        self.samples = {k: len(v) for k, v in delays.items()}
        self.phases = {a: c.most_common(1)[0][0] for a, c in phase_sets.items()}
        self.matched = 0
        self.modelled = 0

    def acks(
        self, sessions: sessionmaker[Session], cmd: Command, node: str
    ) -> list[tuple[float, wire.Ack]]:
        """(when it arrives, the ack) for each phase the command will be acked."""
        with sessions() as s:
            inc = s.get(Incident, cmd.incident_id) if cmd.incident_id is not None else None
            job = s.scalar(select(Job.name).where(Job.id == cmd.job_id))
        key = (job or "", (inc.fault_at if inc else None) or 0.0, cmd.action, node)
        queue = self.recorded.get(key)
        if queue:
            self.matched += 1
            plan = queue.pop(0)
        else:
            self.modelled += 1
            plan = self._modelled(cmd.action)
        # Received when the record received it (an ack's own time is its agent's clock,
        # and it reaches the backend later: an incident resumes at its receipt).
        return [
            (cmd.issued_at + received, _ack(phase, cmd.issued_at + delay, node, detail))
            for phase, delay, detail, received in plan
        ]

    def _modelled(self, action: str) -> list[_Acked]:
        phases = self.phases.get(action)
        if phases:
            return [
                (p, d, "", d)
                for p in phases
                if p != "failed" and (d := self.medians.get((action, p))) is not None
            ]
        return [(p, d, "", d) for p, d in DEFAULT_DELAYS.get(action, {}).items()]


def _ack(phase: str, ts: float, node: str, detail: str) -> wire.Ack:
    """A wire ack; a phase the wire does not know is refused by msgspec's conversion."""
    return msgspec.convert({"phase": phase, "ts": ts, "node": node, "detail": detail}, wire.Ack)
