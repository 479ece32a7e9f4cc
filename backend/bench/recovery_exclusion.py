"""`trainguard bench recovery`'s exclusion modes (backend/bench/recovery.py runs them):
a hard XID (79) on one node of a multi-node job, trainguard's engine excluding that node,
and the job re-forming without it.

- exclude_spare: three nodes, three ft_launchers with `--nnodes 2`; the third starts
  `SPARE_DELAY_S` after the others and waits as a hot spare (torch's dynamic rendezvous
  keeps a launcher beyond MAX nodes in its redundancy list and lets it into the next
  round). The job re-forms on the node that stayed and the spare.
- exclude_shrink: two nodes, two ft_launchers with `--nnodes 1:2` (elastic); the job
  re-forms on the node that stayed, with half the ranks. The readmitted node waits in the
  rendezvous until an operator's launcher restart grows the job back (`grow_back`).

The rest as in `launcher_warm`: the demo job through the worker shim, each agent with a
warm pool of 2 interpreters, the same checkpoints and steps. The ranks run without NVRx's
Wrapper (`--no-wrapper`, as tests/restarts/test_exclusion_spare.py): a lost node is a
launcher-level event, and the Wrapper would first try an in-process restart of ranks that
are about to be ended. The c10d rendezvous is served by the bench's store
(`--rdzv-conf is_host=0`), not by a launcher, so any node may be the one that leaves
(a launcher that hosts the store takes the rendezvous with it).

A real `trainguard server` (recovery_engine.Backend, SQLite, its engine on) and the nodes'
agents posting to it over HTTP with their command executors. The bench is the GPU and the
scheduler: once every rank trained `gap_steps` steps since the job started or last
recovered (and, with a spare, the spare's launcher is waiting in the rendezvous), it
injects XID 79 into the simulated GPU of a local rank of a training node, chosen by
random.Random(seed); the engine excludes the node at once (`RESTART_BM`: exclude_node)
and sends `exclude_node` to that node's agent (SIGTERM to its launcher) and `launcher` to
the others. After the recovery the node is repaired (the simulated GPU reset) and
readmitted (POST /nodes/{node}/uncordon as an operator), and its launcher started again:
a spare once more, or (shrink) a node that the job takes back in at a launcher restart
(`grow_back`), measured as `regrown_s` (the restart's request -> every rank's first step).

Measured per fault, from the fault (the XID event's timestamp): recovery = the first step
completed by every rank of the re-formed job, counting only steps that started after its
first new worker attached (the old generation trains on through an XID until it is
ended); phases: the engine's decision and the node's leaving (`left_at`, from the
exclusion's acks), the re-formed rendezvous round and the rest of recovery_phases.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.backend.bench.recovery_analysis import analyse, recovery_phases, rendezvous_rounds
from trainguard.backend.bench.recovery_engine import BENCH_POLICY, Backend

EXCLUSION_MODES = ("exclude_spare", "exclude_shrink")
JOB = "bench"
GAP_STEPS = 60  # steps every rank trains before the next fault (the first one included)
SPARE_DELAY_S = 5.0  # the spare's launcher starts this much after the others
FAULT_TIMEOUT_S = 180.0  # fault -> recovered, and the readmitted node back
JOIN_LINE = "attempts to join the next round of the rendezvous"
XID = 79

# The recovery bench's policy (cooldown 0, escalation window 1 s) and a breaker window of
# 1 s: the bench puts a hard fault on a node of three (or two) every half minute or so,
# and the default cap (max(1, 25 %) of the cluster's nodes cordoned within 10 minutes)
# would make the second exclusion wait for an operator.
EXCLUSION_POLICY = (
    BENCH_POLICY
    + """[breaker]
window_s = 1
"""
)


class ExclusionError(RuntimeError):
    """The run could not go on (a launcher that should train exited, a wait timed out)."""


@dataclass(frozen=True)
class Layout:
    nodes: int  # agents, one launcher each
    max_nodes: int  # --nnodes MAX: a launcher beyond it waits as a spare
    min_nodes: int | None  # --nnodes MIN:MAX (elastic)
    world_after: int  # ranks training once the job re-formed without the node

    @property
    def world(self) -> int:
        return 2 * self.max_nodes


LAYOUTS = {
    "exclude_spare": Layout(nodes=3, max_nodes=2, min_nodes=None, world_after=4),
    "exclude_shrink": Layout(nodes=2, max_nodes=2, min_nodes=1, world_after=2),
}


def launch_kwargs(mode: str, faults: int) -> dict[str, Any]:
    """The demo job's options for an exclusion mode (besides the rendezvous port)."""
    lay = LAYOUTS[mode]
    kw: dict[str, Any] = {
        # each fault restarts the survivor's workers once, and the readmission (shrink:
        # the job growing back) once more
        "max_restarts": 2 * faults + 2,
        "shim": True,
        "extra_args": ["--no-wrapper"],
        "nnodes": lay.max_nodes,
        "rdzv_host": False,
    }
    if lay.min_nodes is not None:
        kw["min_nodes"] = lay.min_nodes
    if lay.nodes > lay.max_nodes:
        kw["spare_delay_s"] = SPARE_DELAY_S
    return kw


class ExclusionRun:
    """One exclusion mode's job: its launchers, the faults the bench injects, and the
    readmissions (see the module docstring)."""

    def __init__(
        self,
        mode: str,
        nodes: Any,
        backend: Backend,
        launch_kw: dict[str, Any],
        *,
        seed: int,
        gap_steps: int = GAP_STEPS,
        fault_timeout_s: float = FAULT_TIMEOUT_S,
    ) -> None:
        self.mode, self.layout = mode, LAYOUTS[mode]
        self.nodes, self.backend, self.kw = nodes, backend, launch_kw
        self.rng = random.Random(seed)
        self.gap_steps, self.fault_timeout_s = gap_steps, fault_timeout_s
        self.procs: list[Any] = []
        self.faults: list[dict[str, Any]] = []
        self.left: set[int] = set()  # nodes whose launcher the bench expects to end
        self.log_from: dict[int, int] = {}  # node -> its launcher log's size at its start
        self.t0 = self.end = 0.0

    # --- processes ---------------------------------------------------------------------

    def _log(self, i: int) -> Path:
        return Path(self.nodes.workdir) / f"launcher-{i}.log"

    def start(self) -> None:
        from trainguard.backend import demojob

        self.t0 = time.time()
        self.procs = demojob.launch(
            self.nodes.workdir, self.nodes.sockets, self.nodes.store.port, **self.kw
        )

    def stop(self) -> None:
        from trainguard.backend import demojob

        self.end = time.time()
        demojob.stop(self.procs, grace=10.0)

    def _check(self) -> None:
        for i, p in enumerate(self.procs):
            if i not in self.left and p.poll() is not None:
                raise ExclusionError(f"node{i}'s launcher exited with code {p.returncode}")

    def _wait(self, what: str, fn: Any, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.nodes.collect()
            self._check()
            got = fn()
            if got:
                return got
            time.sleep(0.25)
        raise ExclusionError(f"timed out after {timeout:.0f} s waiting for {what}")

    # --- what the agents see -----------------------------------------------------------

    def training(self) -> dict[int, list[Any]]:
        """Node index -> the job's live rank records there."""
        out: dict[int, list[Any]] = {}
        for i, loc in enumerate(self.nodes.locals):
            with loc.cond:
                recs = [r for r in loc.job_ranks(JOB) if r.alive]
            if recs:
                out[i] = recs
        return out

    def trained_since(self, since: float, world: int) -> bool:
        """Every rank of a `world`-rank job made `gap_steps` steps started after `since`."""
        done: dict[int, set[int]] = {}
        for s in self.nodes.steps:
            if s.start > since:
                done.setdefault(s.rank, set()).add(s.step)
        return len(done) >= world and all(len(v) >= self.gap_steps for v in done.values())

    def spare_waiting(self) -> bool:
        """A launcher with no ranks has asked the rendezvous for its next round."""
        busy = set(self.training())
        for i in range(len(self.procs)):
            if i in busy or i in self.left or self.procs[i].poll() is not None:
                continue
            with self._log(i).open("rb") as f:
                f.seek(self.log_from.get(i, 0))
                if JOIN_LINE in f.read().decode(errors="replace"):
                    return True
        return False

    # --- one fault ---------------------------------------------------------------------

    def ready(self, since: float) -> bool:
        if not self.trained_since(since, self.layout.world):
            return False
        if self.layout.nodes > self.layout.max_nodes and not self.spare_waiting():
            return False
        return self.backend_current()

    def backend_current(self) -> bool:
        """The backend's rank table holds the job's live ranks where the agents see them.
        A fault 3 s after the shrunk job grew back found it stale (ranks 2 and 3 not yet on
        the readmitted node, though their rank_start events had come in): the engine took
        the faulty node for the job's only node and kept its launcher."""
        local = {(r.rank, f"node{i}", r.pid) for i, recs in self.training().items() for r in recs}
        got = self.backend.get(f"/api/v1/jobs/{JOB}").get("ranks", [])
        seen = {(r["rank"], r["node"], r["pid"]) for r in got if r.get("alive")}
        return len(local) == self.layout.world and local <= seen

    def inject(self, index: int) -> dict[str, Any]:
        """XID 79 on the GPU of a local rank of a training node (seeded choice)."""
        training = self.training()
        node = self.rng.choice(sorted(training))
        rec = self.rng.choice(sorted(training[node], key=lambda r: r.local_rank))
        step = max((s.step for s in self.nodes.steps), default=0)
        self.left.add(node)
        sim = self.nodes.agents[node].simulated
        event = sim.inject_xid(rec.local_rank, XID, f"injected by the bench (fault {index})")
        fault = {
            "index": index,
            "node": f"node{node}",
            "node_index": node,
            "gpu": rec.local_rank,
            "rank": rec.rank,
            "step": step,
            "ts": float(event.ts),
        }
        self.faults.append(fault)
        return fault

    def incident(self, fault: dict[str, Any]) -> dict[str, Any] | None:
        """The fault's incident once it is closed."""
        for inc in self.backend.incidents(JOB):
            at = inc["timeline"].get("fault_at")
            if at is not None and abs(at - fault["ts"]) < 1.0 and inc["status"] != "open":
                return dict(self.backend.get(f"/api/v1/incidents/{inc['id']}"))
        return None

    def resumed(self, fault: dict[str, Any]) -> float | None:
        """The first rank_start after the fault (a worker of the re-formed job attached)
        once every rank of that job completed a step started after it."""
        starts = [
            float(e.ts)
            for e in self.nodes.events
            if e.kind == "rank_start" and float(e.ts) > fault["ts"]
        ]
        if not starts:
            return None
        cut = min(starts)
        ranks = {s.rank for s in self.nodes.steps if s.start > cut}
        return cut if len(ranks) >= self.layout.world_after else None

    def readmit(self, fault: dict[str, Any]) -> None:
        """As the node's repair and its scheduler would: the GPU back, the cordon lifted by
        an operator, the node's launcher started again once the old one is gone."""
        from trainguard.backend import demojob

        i = fault["node_index"]
        self._wait(f"node{i}'s launcher to end", lambda: self.procs[i].poll() is not None, 60)
        self.nodes.agents[i].simulated.reset(fault["gpu"])
        code, body = self.backend.post(
            f"/api/v1/nodes/node{i}/uncordon", {"reason": "repaired (bench)"}
        )
        if code != 200:
            raise ExclusionError(f"uncordon node{i}: {code} {body}")
        self.log_from[i] = self._log(i).stat().st_size
        fault["readmitted_at"] = time.time()
        (self.procs[i],) = demojob.launch(
            self.nodes.workdir, self.nodes.sockets, self.nodes.store.port, only=i, **self.kw
        )
        self.left.discard(i)

    def run(self, faults: int) -> None:
        since = self.t0
        for index in range(faults):
            since = self.one_fault(index, since)
        self._wait("the last steps", lambda: self.trained_since(since, self.layout.world), 300)

    def one_fault(self, index: int, since: float) -> float:
        """Fault `index` once the job is ready, its recovery, the node's readmission (and
        the job growing back); returns when the next fault's steps count from."""
        self._wait(f"fault {index}'s set-up", lambda: self.ready(since), 300)
        fault = self.inject(index)
        limit = self.fault_timeout_s
        fault["resumed_after"] = self._wait(
            f"fault {index}'s recovery", lambda: self.resumed(fault), limit
        )
        what = f"fault {index}'s incident to close"
        fault["incident"] = self._wait(what, lambda: self.incident(fault), 60)
        self.readmit(fault)
        back_from = float(fault["readmitted_at"])
        if self.layout.nodes == self.layout.max_nodes:
            back_from = self.grow_back(index)
            back = self._wait(
                f"the job to grow back after fault {index}", lambda: self.regrown(back_from), limit
            )
            fault["regrown_s"] = round(back - back_from, 3)
        return back_from

    def grow_back(self, index: int) -> float:
        """An elastic job back to its full size: once the readmitted node's launcher waits
        in the rendezvous, an operator's launcher restart (POST /jobs/{job}/restarts), so
        that the next round takes it in. ft_launcher with `--ft-restart-policy min-healthy`
        turns the rendezvous' upscaling off (its launcher.py: `upscaling_enabled =
        restart_policy != "min-healthy"`): a node that arrives while the job trains waits
        on the redundancy list until the next restart, as the spare does."""
        self._wait(f"node back after fault {index} to wait", self.spare_waiting, 120)
        at = time.time()
        body = {"level": "launcher", "reason": f"bench: grow back after fault {index}"}
        code, got = self.backend.post(f"/api/v1/jobs/{JOB}/restarts", body)
        if code != 202:
            raise ExclusionError(f"launcher restart to grow back: {code} {got}")
        return at

    def regrown(self, since: float) -> float | None:
        """When every rank of the full job first completed a step started after `since`."""
        firsts: dict[int, float] = {}
        for s in sorted(self.nodes.steps, key=lambda s: s.end):
            if s.start > since and s.rank not in firsts:
                firsts[s.rank] = float(s.end)
        return max(firsts.values()) if len(firsts) >= self.layout.world else None


def run_mode(
    mode: str,
    work: Path,
    *,
    faults: int,
    seed: int,
    ckpt_every: int,
    step_sleep: float,
    pool: int,
    gap_steps: int = GAP_STEPS,
    policy: str | None = None,
) -> dict[str, Any]:
    """One exclusion mode, one job run in `work`: the result in recovery.run_mode's shape,
    with `exclusion` (per fault: node, incident, phases) added."""
    from trainguard.backend.bench.recovery import Nodes, logs_tail

    lay = LAYOUTS[mode]
    work.mkdir(parents=True, exist_ok=True)
    if policy is None:
        policy = str(work / "policy.toml")
        Path(policy).write_text(EXCLUSION_POLICY)
    backend = Backend(work / "server", policy)
    nodes = None
    job = None
    error = None
    try:
        nodes = Nodes(work, count=lay.nodes, server=backend.url, token=backend.token, pool=pool)
        kw = launch_kwargs(mode, faults)
        kw.update(
            job=JOB,
            steps=10**6,  # the bench ends the job once the faults are done
            ckpt_every=ckpt_every,
            step_sleep=step_sleep,
            rdzv_port=nodes.store.port,
        )
        job = ExclusionRun(mode, nodes, backend, kw, seed=seed, gap_steps=gap_steps)
        job.start()
        try:
            job.run(faults)
        except ExclusionError as exc:
            error = str(exc)
        finally:
            job.stop()
        for c in nodes.connected:
            c.stop()  # their uplinks send what is left
        nodes.collect()
        return report(mode, nodes, job, error, backend)
    finally:
        if error and nodes is not None:
            (work / "log_tail.txt").write_text(logs_tail(work))
        if nodes is not None:
            nodes.close()
        backend.stop()


def report(
    mode: str, nodes: Any, job: ExclusionRun, error: str | None, backend: Backend
) -> dict[str, Any]:
    lay = LAYOUTS[mode]
    for f in job.faults:  # the step the job was in: the agents' view at the fault lagged
        f["step"] = max((s.step for s in nodes.steps if s.start <= f["ts"]), default=f["step"])
    fired = [(f["ts"], f["index"], f["rank"], f["step"]) for f in job.faults]
    after = {f["index"]: f["resumed_after"] for f in job.faults if "resumed_after" in f}
    out = analyse(
        nodes,
        job.t0,
        job.end,
        world=lay.world,
        fired=fired,
        resumed_after=after,
        resume_world=lay.world_after,
    )
    logs = [f.read_text(errors="replace") for f in sorted(nodes.workdir.glob("launcher-*.log"))]
    phases = recovery_phases(nodes, out["per_fault"], rendezvous_rounds(logs), fired=fired)
    by_index = {p["index"]: p for p in phases}
    rows = []
    for f in job.faults:
        inc = f.get("incident") or {}
        if inc.get("id") is not None:  # its final word: the spare's name comes later
            inc = backend.get(f"/api/v1/incidents/{inc['id']}")
        tl = inc.get("timeline") or {}
        leave = [d for d in inc.get("decisions") or [] if d.get("level") == "exclude_node"]
        left_at = leave[-1].get("left_at") if leave else None
        # the exclusion decision's own time: the timeline's decided_at was missing on
        # the second and later exclusions of one run
        decided_at = leave[-1].get("at") if leave else tl.get("decided_at")
        p = by_index.get(f["index"], {})
        rows.append(
            {
                "index": f["index"],
                "node": f["node"],
                "gpu": f["gpu"],
                "rank": f["rank"],
                "incident_id": inc.get("id"),
                "cause": inc.get("cause"),
                "level": inc.get("level"),
                "status": inc.get("status"),
                "outcome": inc.get("outcome"),
                "leave": leave[-1].get("leave") if leave else None,
                "detected_s": _rel(tl.get("detected_at"), f["ts"]),
                "decided_s": _rel(decided_at, f["ts"]),
                "timeline_decided_s": _rel(tl.get("decided_at"), f["ts"]),
                "left_s": _rel(left_at, f["ts"]),
                "resumed_incident_s": _rel(tl.get("resumed_at"), f["ts"]),
                "regrown_s": f.get("regrown_s"),
                **{k: v for k, v in p.items() if k != "index"},
            }
        )
    plan = [f"fault {f['index']}: xid {XID} on {f['node']} GPU {f['gpu']}" for f in job.faults]
    out.update(
        mode=mode,
        fault_kind=f"xid {XID}",
        plan=plan,
        completed=error is None,
        error=error,
        relaunches=0,
        attempts=len({s.attempt for s in nodes.steps}),
        iterations=len({(s.attempt, s.iteration) for s in nodes.steps}),
        phases=rows,
        exclusion={
            "layout": {
                "nodes": lay.nodes,
                "nnodes": f"{lay.min_nodes}:{lay.max_nodes}" if lay.min_nodes else lay.max_nodes,
                "world_after": lay.world_after,
            },
            "policy": Path(backend.policy).read_text(),
        },
    )
    return out


def _rel(v: float | None, base: float) -> float | None:
    return round(v - base, 3) if v is not None else None
