"""The recorded world, rebuilt in the scratch database as the virtual clock passes it:
what the engine reads (nodes' last batch, ranks alive and where, jobs' generation and
steps, events) at each instant, from the trace's records (docs/replay.md, "What is
replayed").

The database keeps each rank's last row, not its history, so a rank's history is
rebuilt from its events: it runs from the job's first batch (or its `rank_start`),
takes the pid, generation and capabilities its `rank_start` declares, is listed with
every batch of its node while alive (`updated_at`), and is gone from its `rank_exit`.
Its launcher's restart count at a generation is the last one stored less the
generations after it. A node's agent is heard at each recorded batch (`ingest_batches`)
and each event it sent; a step is seen with its node's first batch after the step ended
(on the backend's clock)."""

from __future__ import annotations

import bisect
from typing import Any, get_args

from sqlalchemy import insert, update
from sqlalchemy.orm import Session

from trainguard.backend.cluster.schemas import BackendEventKind
from trainguard.backend.engine.evidence import EVIDENCE_KINDS
from trainguard.backend.jobs.service import UNLISTED_S
from trainguard.backend.models import Event, Node, Rank, Step
from trainguard.backend.replay.gpuspans import Spans
from trainguard.backend.replay.seed import seed
from trainguard.backend.replay.trace import Trace
from trainguard.backend.replay.worldrows import RankState, write_jobs, write_ranks

# At one instant: a job's first listing, the batch's events (in id order), its rank
# table (the agent listing its ranks: an agent that restarted lists those that said hello
# to it, in the same batch), then its steps.
_JOB, _EVENT, _BATCH, _STEP = 0, 1, 2, 3
# Events the engine itself writes (an agent's silence judged, a shadow rule's verdict):
# the record's conclusions, not its inputs; the replay's engine writes its own.
ENGINE_MADE = frozenset(get_args(BackendEventKind))
# A node's clock offset (its last batch's) places its steps on the backend's clock only
# when it is this small; a larger one may not have held over the period.
MAX_OFFSET_S = 10.0


class World:
    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.node_ids = {n["name"]: i for i, n in enumerate(trace["node"], 1)}
        self.job_ids = {j["name"]: i for i, j in enumerate(trace["job"], 1)}
        self.offsets = {
            n["name"]: o if abs(o := n.get("clock_offset_s") or 0.0) <= MAX_OFFSET_S else 0.0
            for n in trace["node"]
        }
        self.final = {(r["job"], r["rank"]): r for r in trace["rank"]}
        self.final_attempt = {j["name"]: j.get("attempt") or 0 for j in trace["job"]}
        self.ranks: dict[tuple[str, int], RankState] = {}
        # A rank's pid before its first rank_start: the one its first exit names.
        self._first_pid: dict[tuple[str, int], int] = {}
        for e in trace["event"]:
            k = (e["job"], e["rank"])
            if e["kind"] in ("rank_start", "rank_exit") and k not in self._first_pid:
                pid = (e["data"] or {}).get("pid")
                self._first_pid[k] = pid if e["kind"] == "rank_exit" and pid else 0
        self.items: list[tuple[float, int, int, dict[str, Any]]] = []
        self.pos = 0
        self.last_beat: dict[str, float] = {}  # each node's last batch applied
        self.epochs: dict[str, int] = {}  # each node's agent starts (agent_start events)
        self.spans = Spans(trace["gpu_span"])
        self._steps: list[dict[str, Any]] = []  # applied, not yet written (_flush)
        self._dirty: dict[int, RankState] = {}
        self.jobs = {
            j["name"]: {
                "last_seen": j["first_seen"],
                "last_step": None,
                "attempt": 0,
                "iteration": 0,
            }
            for j in trace["job"]
        }
        self._dirty_jobs: set[str] = set()
        self._build()

    # --- the timeline ---------------------------------------------------------------------

    def _build(self) -> None:
        beats: dict[str, list[float]] = {}
        goodbye: dict[tuple[str, float], str] = {}
        for b in self.trace["batch"]:
            beats.setdefault(b["node"], []).append(b["received_at"])
            if b.get("going_away"):
                goodbye[(b["node"], b["received_at"])] = b["going_away"]
        for e in self.trace["event"]:
            if e["node"] is not None and e["kind"] not in ENGINE_MADE:
                beats.setdefault(e["node"], []).append(e["received_at"])
        for times in beats.values():
            times.sort()
        items: list[tuple[float, int, int, dict[str, Any]]] = []
        for node, times in beats.items():
            items.extend(
                (t, _BATCH, 0, {"node": node, "going_away": goodbye.get((node, t))}) for t in times
            )
        items.extend(
            (e["received_at"], _EVENT, e["id"], e)
            for e in self.trace["event"]
            if e["kind"] not in ENGINE_MADE
        )
        # A job's ranks are listed from the job's first batch (they may report no step or
        # event before a fault).
        items.extend((j["first_seen"], _JOB, n, j) for n, j in enumerate(self.trace["job"]))
        for n, s in enumerate(self.trace["step"]):
            seen = s["end"] - self.offsets.get(s["node"], 0.0)
            times = beats.get(s["node"], [])
            i = bisect.bisect_left(times, seen)
            items.append((times[i] if i < len(times) else seen, _STEP, n, s))
        items.sort(key=lambda x: (x[0], x[1], x[2]))
        self.items = items
        self._evidence = [
            i for i, (_, k, _, r) in enumerate(items) if k == _EVENT and r["kind"] in EVIDENCE_KINDS
        ]

    @property
    def start(self) -> float:
        return self.items[0][0] if self.items else self.trace.since

    @property
    def end(self) -> float:
        return self.items[-1][0] if self.items else self.trace.until

    def next_at(self) -> float | None:
        return self.items[self.pos][0] if self.pos < len(self.items) else None

    def next_evidence_at(self) -> float | None:
        """When the next evidence is received (the live engine is woken by its commit)."""
        i = bisect.bisect_left(self._evidence, self.pos)
        return self.items[self._evidence[i]][0] if i < len(self._evidence) else None

    # --- the rows ---------------------------------------------------------------------------

    def seed(self, s: Session) -> None:
        """Nodes, GPUs and jobs as first seen, and the cordons in force at the start."""
        seed(s, self.trace, self.node_ids, self.job_ids)

    def advance(self, s: Session, until: float) -> list[int]:
        """Apply what happened up to `until`; returns the ids of the events stored."""
        stored: list[int] = []
        beats: dict[str, float] = {}
        away: dict[str, str | None] = {}  # its last batch's goodbye (any batch clears it)
        while self.pos < len(self.items) and self.items[self.pos][0] <= until:
            t, kind, _, rec = self.items[self.pos]
            self.pos += 1
            if kind == _BATCH:
                beats[rec["node"]] = self.last_beat[rec["node"]] = t
                away[rec["node"]] = rec["going_away"]
                self._heard(s, rec["node"], t)
            elif kind == _JOB:
                for job, rank in self.final:
                    if job == rec["name"]:
                        self._rank(s, job, rank, t)
            elif kind == _EVENT:
                self._event(s, rec)
                stored.append(rec["id"])
            else:
                self._step(s, rec, t)
        for node, t in sorted(beats.items(), key=lambda b: b[1]):
            s.execute(
                update(Node)
                .where(Node.id == self.node_ids[node])
                .values(last_seen=t, going_away=away[node])
            )
            self._generation(s, node)
        self._flush(s)
        self.spans.advance(s, until)
        return stored

    def _generation(self, s: Session, node: str) -> None:
        """As ingest does with each batch that lists ranks: each job's attempt and
        iteration become the highest of the node's ranks listed (each its own maximum),
        whatever another node's batch said before (two launchers count their restarts
        apart)."""
        gens: dict[str, tuple[int, int]] = {}
        for (job, _), r in self.ranks.items():
            if self._listed(r, node):
                a, i = gens.get(job, (0, 0))
                gens[job] = (max(a, r.attempt), max(i, r.iteration))
        for job, (attempt, iteration) in gens.items():
            self._job(job).update(attempt=attempt, iteration=iteration)

    def report_on(self, s: Session, t: float, fresh_s: float) -> None:
        """Past the period's end the world is unknown: a node whose agent reported within
        `fresh_s` of the end is taken to report on (at `t`), so that the replay's tail does
        not read the end of the record as every agent falling silent."""
        until = self.trace.until
        for node, last in self.last_beat.items():
            if last >= until - fresh_s and t > until:
                self._heard(s, node, t)
                s.execute(update(Node).where(Node.id == self.node_ids[node]).values(last_seen=t))
        self._flush(s)

    def _rank(self, s: Session, job: str, rank: int, t: float) -> RankState | None:
        key = (job, rank)
        if key in self.ranks:
            return self.ranks[key]
        fin = self.final.get(key)
        if fin is None or job not in self.job_ids or fin["node"] not in self.node_ids:
            return None
        first = self._first_pid.get(key)
        row = {
            "job_id": self.job_ids[job],
            "rank": rank,
            "node_id": self.node_ids[fin["node"]],
            "local_rank": fin.get("local_rank") or 0,
            "pid": first or fin["pid"],
            "attempt": 0,
            "iteration": 0,
            "alive": True,
            "updated_at": t,
            "in_process": fin.get("in_process"),
            "launcher": fin.get("launcher"),
            "max_restarts": fin.get("max_restarts"),
            "restart_count": self._restart_count(job, fin, 0),
        }
        rid = s.execute(insert(Rank).returning(Rank.id), [row]).scalar_one()
        r = self.ranks[key] = RankState(rid, fin["node"], first or fin["pid"], 0, 0, True, t, None)
        r.epoch = self.epochs.get(fin["node"], 0)
        return r

    def _restart_count(self, job: str, fin: dict[str, Any], attempt: int) -> int | None:
        count = fin.get("restart_count")
        if count is None:
            return None
        return max(0, count - max(0, (fin.get("attempt") or 0) - attempt))

    def _listed(self, r: RankState, node: str) -> bool:
        """Whether the node's agent lists the rank: one of its ranks registered with the
        agent running now (an agent restarted knows only the ranks that said hello to it
        since: its `rank_start`)."""
        return r.node == node and r.epoch == self.epochs.get(node, 0)

    def _heard(self, s: Session, node: str, t: float) -> None:
        """A batch of the node: its live ranks (and their jobs) are listed again. A rank
        held alive that its agent has not listed for UNLISTED_S ended unseen (its agent
        was down, or restarted and never heard from it again), as ingest marks it."""
        gone = [
            r
            for r in self.ranks.values()
            if r.node == node and r.alive and not self._listed(r, node)
            if r.updated_at < t - UNLISTED_S
        ]
        for r in gone:
            r.alive = False
            self._dirty[r.id] = r
        for (job, _), r in self.ranks.items():
            if r.alive and self._listed(r, node):
                r.updated_at = t
                self._dirty[r.id] = r
                self._job(job)["last_seen"] = t

    def _event(self, s: Session, e: dict[str, Any]) -> None:
        t = e["received_at"]
        s.execute(
            insert(Event),
            [
                {
                    "node_id": self.node_ids.get(e["node"]) if e["node"] else None,
                    "ts": e["ts"],
                    "received_at": t,
                    "kind": e["kind"],
                    "gpu_uuid": e["gpu_uuid"],
                    "job": e["job"],
                    "rank": e["rank"],
                    "xid": e["xid"],
                    "message": e["message"] or "",
                    "data": e["data"] or {},
                }
            ],
        )
        if e["kind"] == "agent_start" and e["node"] is not None:
            self.epochs[e["node"]] = self.epochs.get(e["node"], 0) + 1
        if e["job"] is None or e["rank"] is None:
            return
        data = e["data"] or {}
        if e["kind"] == "restart" and data.get("level") == "in_process":
            # The agent's record of the rank moves to its new iteration when the rank
            # says it entered it (before its first step there).
            known = self.ranks.get((e["job"], e["rank"]))
            if known is not None and isinstance(data.get("iteration"), int):
                known.iteration = max(known.iteration, data["iteration"])
                self._dirty[known.id] = known
            return
        if e["kind"] not in ("rank_start", "rank_exit"):
            return
        r = self._rank(s, e["job"], e["rank"], t)
        if r is None:
            return
        fin = self.final[(e["job"], e["rank"])]
        vals: dict[str, Any] = {"updated_at": t}
        if e["kind"] == "rank_start":
            r.alive = True
            r.pid = data.get("pid") or r.pid
            r.pid_known = bool(data.get("pid"))
            r.attempt = data.get("attempt", r.attempt) or 0
            r.iteration = data.get("iteration", r.iteration) or 0
            if e["node"] in self.node_ids:
                r.node = e["node"]
                r.epoch = self.epochs.get(e["node"], 0)
                vals["node_id"] = self.node_ids[e["node"]]
            vals.update(
                alive=True,
                pid=r.pid,
                attempt=r.attempt,
                iteration=r.iteration,
                restart_count=self._restart_count(e["job"], fin, r.attempt),
            )
            for k in ("in_process", "launcher", "local_rank"):
                if data.get(k) is not None:
                    vals[k] = data[k]
            row = self._job(e["job"])
            row["last_seen"] = max(row["last_seen"], t)
        else:
            pid = data.get("pid")
            if pid is not None and r.pid_known and pid != r.pid:
                return  # an earlier generation's exit
            r.alive = False
            vals["alive"] = False
        r.updated_at = t
        s.execute(update(Rank).where(Rank.id == r.id).values(**vals))

    def _job(self, name: str) -> dict[str, Any]:
        """The job's row as the world has it (written at the end of `advance`)."""
        self._dirty_jobs.add(name)
        return self.jobs[name]

    def _flush(self, s: Session) -> None:
        """Write what `advance` applied: the steps, and the ranks' and jobs' rows as they
        now are, each in one statement."""
        if self._steps:
            s.execute(insert(Step), self._steps)
            self._steps = []
        if self._dirty:
            write_ranks(s, self._dirty.values(), self.node_ids)
            self._dirty = {}
        if self._dirty_jobs:
            write_jobs(s, {n: self.jobs[n] for n in self._dirty_jobs}, self.job_ids)
            self._dirty_jobs = set()

    def _step(self, s: Session, st: dict[str, Any], t: float) -> None:
        if st["job"] not in self.job_ids or st["node"] not in self.node_ids:
            return
        self._steps.append(
            {
                "job_id": self.job_ids[st["job"]],
                "node_id": self.node_ids[st["node"]],
                "rank": st["rank"],
                "step": st["step"],
                "start": st["start"],
                "end": st["end"],
                "attempt": st["attempt"],
                "iteration": st["iteration"],
                "compute_s": st["compute_s"],
            }
        )
        r = self._rank(s, st["job"], st["rank"], t)
        if r is not None:
            newer = (st["attempt"], st["iteration"]) > (r.attempt, r.iteration)
            if newer:
                r.attempt, r.iteration = st["attempt"], st["iteration"]
            r.last_step = st["step"] if r.last_step is None else max(r.last_step, st["step"])
            if st["node"] != r.node:
                r.node = st["node"]
            if r.alive:
                r.updated_at = max(r.updated_at, t)
            self._dirty[r.id] = r
        row = self._job(st["job"])
        last = row["last_step"]
        row["last_step"] = st["step"] if last is None else max(last, st["step"])
        row["last_seen"] = max(row["last_seen"], t)
