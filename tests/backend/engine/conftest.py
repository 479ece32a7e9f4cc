"""Engine tests: the real app (ingest, acks, reads) on SQLite and PostgreSQL, with its own
background engine switched off and a test engine on the same database whose clock the
test moves (cooldowns, windows and budgets are about time passing; no sleeps)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from trainguard.backend.analytics import service as analytics_service
from trainguard.backend.engine.engine import DecisionEngine
from trainguard.backend.engine.leader import SingleProcessLeadership
from trainguard.backend.engine.policy import load_policy
from trainguard.backend.incidents import acks as incidents_acks
from trainguard.backend.incidents import operators as incidents_operators
from trainguard.backend.ingest import router as ingest_router
from trainguard.backend.models import Command, Incident, Node, Rank
from trainguard.protocol import wire

# Ranks stay "live" for the whole test whatever the test clock says.
FRESH_S = 3600.0


class Clock:
    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> float:
        self.t += s
        return self.t


class _ClockTime:
    """The `time` module as seen by the backend's request handlers in these tests: its
    time() is the test clock, so received and ack times move with the engine's clock and
    the timelines the engine builds are in the order they would be for real (and goodput's
    "now" is the engine's)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def time(self) -> float:
        return self._clock()

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class Cluster:
    """Posts what agents would post, and reads what the engine decided."""

    def __init__(self, client: Any, engine: DecisionEngine, clock: Clock) -> None:
        self.client, self.engine, self.clock = client, engine, clock
        self.seq: dict[str, int] = {}

    def post(self, node: str, **kw: Any) -> None:
        seq = self.seq[node] = self.seq.get(node, 0) + 1
        batch = wire.Batch(node=node, agent_id=f"agent-{node}", seq=seq, sent_at=time.time(), **kw)
        r = self.client.post("/api/v1/ingest", content=wire.encode(batch))
        assert r.status_code == 200, r.text

    def job(self, job: str, layout: dict[str, tuple[int, ...]], step: int = 10) -> None:
        """Ranks of a job on nodes ({node: ranks}), each having completed `step`."""
        world = sum(len(r) for r in layout.values())
        for node, ranks in layout.items():
            self.post(
                node,
                ranks=[
                    wire.RankStatus(job=job, rank=r, pid=1000 + r, world_size=world, last_step=step)
                    for r in ranks
                ],
                steps=[
                    wire.StepReport(
                        job=job, rank=r, step=step, start=self.clock.t - 1, end=self.clock.t
                    )
                    for r in ranks
                ],
            )

    def exited(self, node: str, job: str, ranks: tuple[int, ...], code: int = 0) -> float:
        """The ranks' processes on `node` exited with `code` now, as their agent reports it
        (listed not alive, one rank_exit each); returns when."""
        end = self.clock.t
        self.post(
            node,
            ranks=[wire.RankStatus(job=job, rank=r, pid=1000 + r, alive=False) for r in ranks],
            events=[
                wire.Event(kind="rank_exit", ts=end, job=job, rank=r, data={"exit_code": code})
                for r in ranks
            ],
        )
        return end

    def event(self, node: str, kind: str, ts: float | None = None, **kw: Any) -> None:
        self.post(node, events=[wire.Event(kind=kind, ts=self.clock.t if ts is None else ts, **kw)])

    def heard(self, node: str, at: float) -> None:
        """The node's agent (and its ranks' reports) last heard at `at` (backend clock)."""
        with self.engine.sessions() as s, s.begin():
            n = s.scalar(select(Node).where(Node.name == node))
            assert n is not None
            n.last_seen = at
            s.execute(update(Rank).where(Rank.node_id == n.id).values(updated_at=at))

    def decide(self) -> None:
        assert self.engine.run_once()

    # --- reads ------------------------------------------------------------------------

    def incidents(self, job: str | None = None) -> list[dict[str, Any]]:
        params = {"job": job} if job else {}
        return list(reversed(self.client.get("/api/v1/incidents", params=params).json()))

    def commands(self, node: str) -> list[dict[str, Any]]:
        return self.client.get(f"/api/v1/agents/{node}/commands", params={"wait": 0}).json()

    def ack(self, command_id: str, node: str, *phases: str, detail: str = "") -> None:
        for phase in phases:
            r = self.client.post(
                f"/api/v1/commands/{command_id}/acks",
                json={"phase": phase, "ts": self.clock.t, "node": node, "detail": detail},
            )
            assert r.status_code == 200, r.text

    def recover(self) -> int:
        """Play every agent that has commands: ack each through `resumed`. Returns how
        many commands there were."""
        n = 0
        with self.engine.sessions() as s:
            rows = s.execute(
                select(Command.id, Command.node_id).where(Command.delivered_at.is_(None))
            ).all()
            names = {nid: s.get(Node, nid).name for _, nid in rows}  # type: ignore[union-attr]  # a command's node exists
        for cid, nid in rows:
            self.ack(cid, names[nid], "delivered", "torn_down", "restarted", "resumed")
            n += 1
        return n

    def all_commands(self) -> list[Command]:
        with self.engine.sessions() as s:
            return list(s.scalars(select(Command).order_by(Command.issued_at)))

    def incident_rows(self) -> list[Incident]:
        with self.engine.sessions() as s:
            return list(s.scalars(select(Incident).order_by(Incident.id)))


@pytest.fixture
def make_cluster(
    make_client: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Cluster]]:
    engines: list[DecisionEngine] = []

    def make(policy: str = "", fresh: float = FRESH_S, **settings: Any) -> Cluster:
        client = make_client(engine_enabled=False, **settings)
        path = tmp_path / f"policy-{len(engines)}.toml"
        path.write_text(policy)
        clock = Clock()
        for module in (
            ingest_router,
            incidents_acks,
            incidents_operators,
            analytics_service,
        ):
            monkeypatch.setattr(module, "time", _ClockTime(clock))
        engine = DecisionEngine(
            client.app.state.sessions,
            load_policy(path),
            SingleProcessLeadership(),
            fresh_within_s=fresh,
            notifier=client.app.state.commands_notifier,
            bus=client.app.state.bus,
            clock=clock,
        )
        engines.append(engine)
        return Cluster(client, engine, clock)

    yield make
    for e in engines:
        e.stop()
