"""Drive the real decision engine (engine.DecisionEngine: the same Decider, sweeps and
incident transitions as the live one) over a trace, on a scratch database, with a
virtual clock (docs/replay.md).

- The clock steps as the live engine's cycles do: one when evidence is received (the
  live one is woken by the ingest commit), else `sweep_s` after the last, or, while
  nothing can change by the clock alone (calm.py), at the next deadline. What is
  received in between (the recorded world, world.World: batches, steps, events; the
  acks) is stored at its own instant, between two cycles, as ingest and the ack route
  store it beside the engine.
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
from trainguard.backend.engine.leader import SingleProcessLeadership
from trainguard.backend.engine.policy import Policy
from trainguard.backend.hooks import HookResult
from trainguard.backend.incidents import acks
from trainguard.backend.models import Command, Event, Incident, Job, Node, NodeCordon
from trainguard.backend.models.control import EngineState
from trainguard.backend.replay import scratch
from trainguard.backend.replay.ackmodel import AckModel
from trainguard.backend.replay.calm import calm_until
from trainguard.backend.replay.trace import Trace, incident_row
from trainguard.backend.replay.world import World
from trainguard.protocol import wire

# The record's decisions are read when it is exported: the clock runs on past the period
# to that instant (at most this long; this long for a trace that does not say when), so
# that what was under way at the end (a cooldown, an ack, a resumption) goes as far.
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
    cmds = _Commands()
    out = Outcome(policy=policy.source)
    stop = _stop(trace, world)
    n = 0
    last_cycle = clock.t
    calm: float | None = None
    while True:
        # As the live engine: a cycle when evidence is stored (ingest wakes it), else
        # `sweep_s` after the last one; what the agents send in between (batches, steps,
        # acks) is stored at its own instant and read at the next cycle.
        t = last_cycle + sweep_s
        if calm is not None and calm > t:
            t = calm  # nothing can change before (calm.py); evidence still wakes a cycle
        woken = world.next_evidence_at()
        if woken is not None and woken < t:
            t = max(woken, last_cycle)
        if t > stop:
            break
        with sessions() as s, s.begin():
            while due and due[0][0] <= t:
                at, _, cid, _, ack = heapq.heappop(due)
                world.advance(s, at)
                acks.record_ack(s, cid, ack, now=at)
                out.acks += 1
            world.advance(s, t)
            if t > trace.until:
                world.report_on(s, t, fresh_within_s)
        clock.t = last_cycle = t
        eng.run_once()
        out.cycles += 1
        for cmd, node in cmds.new(sessions):
            for at, ack in model.acks(sessions, cmd, node):
                n += 1
                heapq.heappush(due, (max(at, clock.t), n, cmd.id, node, ack))
        calm = None
        if not due and eng._hook_results.empty():
            with sessions() as s:
                calm = calm_until(s, clock.t, policy, fresh_within_s)
    eng.stop(timeout=0)
    incs, cordons = _collect(sessions)
    # The period's decisions, as the export reads the record's: the tail only lets what
    # was under way at its end go on.
    out.incidents = [i for i in incs if i["created_at"] <= trace.until]
    out.cordons = [c for c in cordons if c["at"] <= trace.until]
    return out


def _stop(trace: Trace, world: World) -> float:
    """Where the virtual clock stops: when the record was read (its incidents' state is
    then's), at most TAIL_S past the period's end, whose world is not in the trace."""
    end = max(world.end, trace.until)
    if trace.exported_at is None:
        return end + TAIL_S
    return end + min(TAIL_S, max(0.0, trace.exported_at - end))


class _Commands:
    """The commands the engine issued since the last look (issued at the virtual clock:
    never before the last one seen)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.since = float("-inf")

    def new(self, sessions: sessionmaker[Session]) -> list[tuple[Command, str]]:
        with sessions() as s:
            rows = s.execute(
                select(Command, Node.name)
                .join(Node, Node.id == Command.node_id)
                .where(Command.issued_at >= self.since)
                .order_by(Command.issued_at, Command.id)
            ).all()
        out = [(c, name) for c, name in rows if c.id not in self.seen]
        if out:
            self.since = max(c.issued_at for c, _ in out)
            self.seen = {c.id for c, _ in rows if c.issued_at >= self.since}
        return out


def _collect(sessions: sessionmaker[Session]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    with sessions() as s:
        nodes = dict(s.execute(select(Node.id, Node.name)).all())
        jobs = dict(s.execute(select(Job.id, Job.name)).all())
        incs = [
            incident_row(
                i, jobs.get(i.job_id), nodes.get(i.node_id) if i.node_id is not None else None
            )
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
