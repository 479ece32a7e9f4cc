"""Drive the real decision engine (engine.DecisionEngine: the same Decider, sweeps and
incident transitions as the live one) over a trace, on a scratch database, with a
virtual clock (docs/replay.md).

- The clock steps through the recorded world (world.World): at each instant something
  was received, the world is applied and, if evidence came, the engine runs a cycle
  (the live one is woken by the ingest commit); between them it sweeps every
  `sweep_s` while anything is under way (an open incident, an ack due, evidence in the
  last IDLE_S), else every IDLE_TICK_S (an incident pending an operator waits for no
  clock).
- No command reaches an agent: there is none. The commands the replay issues are acked
  by the ack model (acks.AckModel) through the real ack path (incidents.acks).
- No hook runs: a hook's result is the one recorded for the same incident, else a
  success ("not run: replay"). No notifier, live bus or alert webhook is wired.
"""

from __future__ import annotations

import heapq
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from trainguard.backend.engine.actions import HookJob
from trainguard.backend.engine.engine import CURSOR, DecisionEngine
from trainguard.backend.engine.evidence import EVIDENCE_KINDS
from trainguard.backend.engine.leader import SingleProcessLeadership
from trainguard.backend.engine.policy import Policy
from trainguard.backend.hooks import HookResult
from trainguard.backend.incidents import acks
from trainguard.backend.models import Command, Event, Incident, Job, Node, NodeCordon
from trainguard.backend.models.control import EngineState
from trainguard.backend.replay import scratch
from trainguard.backend.replay.ackmodel import AckModel
from trainguard.backend.replay.trace import Trace
from trainguard.backend.replay.world import World
from trainguard.protocol import wire

IDLE_S = 30.0
IDLE_TICK_S = 5.0
# After the last recorded instant the clock runs on this long, so that what was under
# way (a cooldown, an ack, a resumption) ends as it would have.
TAIL_S = 300.0


class VirtualClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class ReplayEngine(DecisionEngine):
    """The live engine, with hooks answered from the record instead of run."""

    def __init__(
        self,
        *args: Any,
        hooks: dict[tuple[str, float], list[dict[str, Any]]],
        record_ends: float,
        **kw: Any,
    ):
        super().__init__(*args, **kw)
        self.recorded_hooks = hooks
        self.record_ends = record_ends

    def _sweep(self, s: Session) -> None:
        # Past the period's end the record says nothing of the nodes (they may well report
        # on): their silence there is the record's end, not a node's death. Judged as if the
        # engine had just started listening, it is never evidence.
        if self.clock() > self.record_ends:
            self._leading_since = self.clock()
        super()._sweep(s)

    def _submit_hook(self, job: HookJob) -> None:
        with self.sessions() as s:
            inc = s.get(Incident, job.incident_id)
            jname = s.scalar(select(Job.name).where(Job.id == inc.job_id)) if inc else None
            fault = inc.fault_at if inc is not None else None
        recorded = [h for h in self.recorded_hooks.get((jname or "", fault or 0.0), ())]
        same = [h for h in recorded if h.get("hook") == job.hook]
        now = self.clock()
        if same:
            h = same[0]
            result = HookResult(
                job.hook, [], bool(h.get("ok")), h.get("rc"), "replayed: recorded result", now, 0.0
            )
        else:
            result = HookResult(job.hook, [], True, 0, "not run: replay", now, 0.0)
        self._running_hooks.add(job.key)
        self._hook_results.put((job, result))


@dataclass
class Outcome:
    """What one replay decided: the scratch database's incidents, as plain records."""

    policy: str
    incidents: list[dict[str, Any]] = field(default_factory=list)
    cordons: list[dict[str, Any]] = field(default_factory=list)
    cycles: int = 0
    acks: int = 0


def replay(trace: Trace, policy: Policy, folder: Path | None = None, **kw: Any) -> Outcome:
    """Replay `trace` under `policy` in a scratch database (in `folder`, else a
    temporary folder removed afterwards)."""
    if folder is None:
        with tempfile.TemporaryDirectory(prefix="tg-replay-") as tmp:
            return _replay(trace, policy, Path(tmp), **kw)
    return _replay(trace, policy, folder, **kw)


def _replay(
    trace: Trace,
    policy: Policy,
    folder: Path,
    *,
    fresh_within_s: float,
    sweep_s: float = 0.5,
    name: str = "replay.db",
) -> Outcome:
    engine_db, sessions = scratch.migrated(folder, name)
    try:
        return _drive(trace, policy, sessions, fresh_within_s, sweep_s)
    finally:
        engine_db.dispose()


def _drive(
    trace: Trace,
    policy: Policy,
    sessions: sessionmaker[Session],
    fresh_within_s: float,
    sweep_s: float,
) -> Outcome:
    world = World(trace)
    clock = VirtualClock(min(world.start, trace.since))
    hooks: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for inc in trace["incident"]:
        hooks.setdefault((inc["job"], inc["fault_at"] or 0.0), []).extend(inc["hooks"])
    model = AckModel(trace)
    with sessions() as s, s.begin():
        world.seed(s)
        world.advance(s, trace.since - 1e-6)  # the warm-up: history, not decided on
        hi = s.scalar(select(func.max(Event.id))) or 0
        s.add(EngineState(name=CURSOR, value={"hi": hi}, updated_at=clock()))
    clock.t = trace.since
    eng = ReplayEngine(
        sessions,
        policy,
        SingleProcessLeadership(),
        fresh_within_s=fresh_within_s,
        sweep_s=sweep_s,
        clock=clock,
        hooks=hooks,
        record_ends=trace.until,
    )
    # The live engine had been listening long before the period (silence is judged).
    eng.run_once()
    eng._leading_since = trace.since - fresh_within_s - 1.0
    due: list[tuple[float, int, str, str, wire.Ack]] = []
    seen_cmds: set[str] = set()
    out = Outcome(policy=policy.source)
    last_evidence = trace.since
    kinds = {e["id"]: e["kind"] for e in trace["event"]}
    stop = max(world.end, trace.since) + TAIL_S
    n = 0
    while clock.t <= stop:
        nxt = world.next_at()
        busy = _busy(sessions) or bool(due) or clock.t - last_evidence < IDLE_S
        tick = clock.t + (sweep_s if busy else IDLE_TICK_S)
        candidates = [tick] + ([nxt] if nxt is not None else []) + ([due[0][0]] if due else [])
        t = min(candidates)
        if t > stop:
            break
        clock.t = max(t, clock.t)
        with sessions() as s, s.begin():
            ids = world.advance(s, clock.t)
            while due and due[0][0] <= clock.t:
                _, _, cid, _, ack = heapq.heappop(due)
                acks.record_ack(s, cid, ack, now=clock.t)
                out.acks += 1
        if any(kinds[i] in EVIDENCE_KINDS for i in ids):
            last_evidence = clock.t
        eng.run_once()
        out.cycles += 1
        for cmd, node in _new_commands(sessions, seen_cmds):
            for at, ack in model.acks(sessions, cmd, node):
                n += 1
                heapq.heappush(due, (max(at, clock.t), n, cmd.id, node, ack))
    eng.stop(timeout=0)
    out.incidents, out.cordons = _collect(sessions)
    return out


def _busy(sessions: sessionmaker[Session]) -> bool:
    with sessions() as s:
        return bool(
            s.scalar(select(func.count()).select_from(Incident).where(Incident.status == "open"))
        )


def _new_commands(sessions: sessionmaker[Session], seen: set[str]) -> list[tuple[Command, str]]:
    with sessions() as s:
        rows = s.execute(
            select(Command, Node.name)
            .join(Node, Node.id == Command.node_id)
            .order_by(Command.issued_at, Command.id)
        ).all()
    out = [(c, name) for c, name in rows if c.id not in seen]
    seen.update(c.id for c, _ in out)
    return out


def _collect(sessions: sessionmaker[Session]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    with sessions() as s:
        nodes = dict(s.execute(select(Node.id, Node.name)).all())
        jobs = dict(s.execute(select(Job.id, Job.name)).all())
        incs = [
            {
                "id": i.id,
                "job": jobs.get(i.job_id),
                "trigger": i.trigger,
                "cause": i.cause,
                "level": i.level,
                "status": i.status,
                "outcome": i.outcome,
                "node": nodes.get(i.node_id) if i.node_id is not None else None,
                "created_at": i.created_at,
                "fault_at": i.fault_at,
                "decided_at": i.decided_at,
                "acted_at": i.acted_at,
                "resumed_at": i.resumed_at,
                "closed_at": i.closed_at,
                "escalations": i.escalations,
                "decisions": i.decisions or [],
                "hooks": i.hooks or [],
            }
            for i in s.scalars(select(Incident).order_by(Incident.id))
        ]
        cordons = [
            {
                "node": nodes.get(c.node_id),
                "at": c.at,
                "by": c.by,
                "incident": c.incident_id,
                "released_at": c.released_at,
            }
            for c in s.scalars(select(NodeCordon).order_by(NodeCordon.at))
            if c.incident_id is not None or c.by == "engine"
        ]
    return incs, cordons
