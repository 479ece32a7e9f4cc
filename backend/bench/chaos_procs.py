"""The processes of one `trainguard bench chaos` run (backend/bench/chaos.py runs it):
`Chaos` starts the server, the store, one agent per simulated node and the demo job's
runs, brings the faults from outside during the chaos phase (chaos_outside.py), looks at
the API and the processes side by side, reads each ended run's goodput twice, and at the
end collects what happened (the faults the ranks fired, the bench's own faults, the
database's and the API's rows) for backend/bench/chaos_report.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.backend.bench.chaos_checks import Fault, Step
from trainguard.backend.bench.chaos_config import (
    GPUS_PER_NODE,
    ChaosConfig,
    ChaosError,
    _plan,
    budget_run,
)
from trainguard.backend.bench.chaos_outside import SIGTERM_WAIT_S, Outside
from trainguard.backend.bench.chaos_rows import (
    incidents_from_database,
    proc_start,
    read_database,
    workers,
)
from trainguard.backend.demowatch import relaunch_readmitted

STOPPED = "stopped by the bench"  # how the runs end that the bench stops at its stop
GOODPUT_GAP_S = 10.0  # between the two reads of an ended run's goodput


@dataclass
class JobRun:
    n: int
    job: str
    seed: int
    workdir: Path
    procs: list[subprocess.Popen[bytes]]
    started_at: float
    ended_at: float | None = None
    exit_codes: list[int | None] = field(default_factory=list)
    end: str | None = None  # exited | user SIGTERM | stalled | stopped by the bench
    newest_checkpoint: str | None = None
    progress_at: float = 0.0
    max_restarts: int = 0  # its launchers' --max-restarts
    sigterm_at: float | None = None  # the user's SIGTERM of its launchers (chaos_outside)
    # when the backend could know of its end: the end, or when the agent that was down at
    # it came back (its ranks' exits were lost with it); None while that agent is down
    end_seen_at: float | None = None
    # GET /jobs/{job}/goodput twice after the run ended (report: goodput after the end)
    goodput_reads: list[dict[str, Any]] = field(default_factory=list)


class Chaos:
    """The processes of one bench run and what the bench saw of them."""

    def __init__(self, work: Path, cfg: ChaosConfig) -> None:
        self.work, self.cfg = work, cfg
        self.names = [f"chaos-node-{i}" for i in range(cfg.nodes)]
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.agent_since: dict[str, float] = {}
        self.backend: Any = None
        self.store: Any = None
        self.runs: list[JobRun] = []
        self.seen: dict[int, str] = {}  # every worker pid seen -> its start time
        self.agent_exits: list[dict[str, Any]] = []  # exits the bench did not cause
        self.observations: list[dict[str, Any]] = []
        self.outside = Outside(self)
        self.first_step_at: float | None = None
        self.start = self.stop_at = 0.0
        self.relaunch_wait_s = 120.0  # the policy's escalation.relaunch_wait_s (up())

    # --- processes ---------------------------------------------------------------------

    def up(self) -> None:
        from trainguard.agent.executors.storehost import StoreHost
        from trainguard.backend import demojob
        from trainguard.backend.bench.recovery_engine import Backend
        from trainguard.backend.engine.policy import PolicyError, load_policy

        policy = self.cfg.policy
        if policy is None:  # an empty policy file: the defaults, as `trainguard demo` runs
            policy = str(self.work / "policy.toml")
            Path(policy).write_text("# trainguard bench chaos: the default policy\n")
        try:
            self.relaunch_wait_s = load_policy(policy).model.escalation.relaunch_wait_s
        except PolicyError as exc:
            raise ChaosError(str(exc)) from None
        self.store = StoreHost(port=demojob.free_port())
        self.store.start()
        try:
            self.backend = Backend(self.work / "server", policy)
        except RuntimeError as exc:
            raise ChaosError(f"{exc}; see {self.work / 'server' / 'server.log'}") from None
        for name in self.names:
            self.start_agent(name)
        deadline = time.monotonic() + 90
        while len([n for n in self._get("/api/v1/nodes") or [] if n["gpu_count"]]) < len(
            self.names
        ):
            if time.monotonic() > deadline:
                raise ChaosError(f"the agents did not register in 90 s; see {self.work}")
            time.sleep(0.5)

    def start_agent(self, name: str) -> None:
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "TRAINGUARD_AGENT_SPOOL_DIR": str(self.work / "spool" / name),
            "TRAINGUARD_AGENT_SOCKET_PATH": str(self.work / f"{name}.sock"),
        }
        argv = [sys.executable, "-m", "trainguard.agent.cli", "agent", "--server", self.backend.url]
        argv += ["--token", self.backend.token, "--node", name]
        argv += ["--simulate", str(GPUS_PER_NODE)]
        with (self.work / f"{name}.log").open("ab") as log:
            self.agents[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
        self.agent_since[name] = time.time()

    def launch(self) -> JobRun:
        n = len(self.runs) + 1
        run = JobRun(n, f"chaos-{n}", self.cfg.seed * 1000 + n, self.work / f"job-{n}", [], 0.0)
        # each fault may cost a restart of its own and one for trainguard's command, an
        # agent death one more; a budget run gets the small budget the operator meets
        run.max_restarts = 3 * self.cfg.faults_per_run + 4
        if budget_run(self.cfg, n):
            run.max_restarts = self.cfg.small_max_restarts
        run.procs = self._start(run)
        run.started_at = run.progress_at = time.time()
        self.runs.append(run)
        return run

    def _start(self, run: JobRun, only: int | None = None) -> list[subprocess.Popen[bytes]]:
        """The run's launchers (or node `only`'s): all nodes but the spares train; the
        rendezvous is served by the bench's store, so no node takes it along."""
        from trainguard.backend import demojob

        return demojob.launch(
            run.workdir,
            [str(self.work / f"{name}.sock") for name in self.names],
            self.store.port,
            job=run.job,
            steps=self.cfg.steps,
            ckpt_every=self.cfg.ckpt_every,
            max_restarts=run.max_restarts,
            faults=self.cfg.faults_per_run,
            fault_seed=run.seed,
            fault_after_step=self.cfg.after_step,
            fault_kinds=self.cfg.kinds,
            fault_min_gap=self.cfg.min_gap,
            step_sleep=self.cfg.step_sleep,
            nnodes=self.cfg.nodes - self.cfg.spares,
            rdzv_port=self.store.port,
            rdzv_host=False,
            only=only,
        )

    def end_run(self, run: JobRun, why: str) -> None:
        from trainguard.backend import demojob

        if run.ended_at is None:
            demojob.stop(run.procs, grace=10.0)
            run.ended_at, run.end = time.time(), why
            run.exit_codes = [p.poll() for p in run.procs]

    def down(self) -> None:
        """Stop everything still running (idempotent): the job, its leftover workers, the
        agents, the server, the store."""
        for run in self.runs:
            self.end_run(run, STOPPED)
        for pid, start in self.seen.items():
            if proc_start(pid) == start:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        self.stop_agents()
        if self.backend is not None:
            self.backend.stop()
            self.backend = None
        self.store = None

    def stop_agents(self) -> None:
        for p in self.agents.values():
            if p.poll() is None:
                p.terminate()
        for p in self.agents.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    # --- the chaos phase ---------------------------------------------------------------

    def _get(self, path: str, **params: Any) -> Any:
        try:
            return self.backend.get(path, **params)
        except Exception:  # a busy server misses an observation, not the run
            return None

    def loop(self) -> None:
        self.start = time.time()
        until = self.start + self.cfg.minutes * 60
        run = self.launch()
        next_obs = next_readmit = 0.0
        while time.time() < until:
            now = time.time()
            self._check_processes()
            if all(p.poll() is not None for p in run.procs):
                self.end_run(run, "user SIGTERM" if run.sigterm_at else "exited")
                run = self.launch()
            elif run.sigterm_at is not None and now - run.sigterm_at > SIGTERM_WAIT_S:
                self.end_run(run, f"user SIGTERM, killed after {SIGTERM_WAIT_S:g} s")
                run = self.launch()
            elif now - run.progress_at > self.cfg.stall_s:
                self.end_run(run, "stalled")
                run = self.launch()
            if self.cfg.spares and now >= next_readmit:
                next_readmit = now + 5.0
                self.readmitted(run)
            self.outside.tick(now, until)
            if now >= next_obs:
                next_obs = now + self.cfg.observe_every_s
                self.observe(run)
            time.sleep(0.25)
        self.outside.finish()

    def readmitted(self, run: JobRun) -> None:
        """A node that left the run and was readmitted gets its launcher again, as the
        run's next spare (demowatch.relaunch_readmitted, as the demo does)."""
        nodes: dict[str, Any] | None = None

        def cordoned(name: str) -> bool | None:
            nonlocal nodes
            if nodes is None:
                nodes = {n["name"]: n for n in self._get("/api/v1/nodes") or []}
            node = nodes.get(name)
            return None if node is None else bool(node.get("cordoned"))

        relaunch_readmitted(run.procs, self.names, cordoned, lambda i: self._start(run, only=i)[0])

    def _check_processes(self) -> None:
        """The server must live; an agent that exited though the bench did not kill it is
        recorded and started again."""
        code = self.backend.proc.poll()
        if code is not None:
            log = self.work / "server" / "server.log"
            raise ChaosError(f"the server exited with code {code}; see {log}")
        dead = self.outside.dead
        for name, p in self.agents.items():
            if p.poll() is not None and (dead is None or dead["node"] != name):
                self.agent_exits.append({"node": name, "code": p.returncode, "at": time.time()})
                self.start_agent(name)

    def observe(self, run: JobRun) -> None:
        """One look at the API and at the processes, side by side."""
        now = time.time()
        jobs = {j["name"]: j for j in self._get("/api/v1/jobs") or []}
        nodes = self._get("/api/v1/nodes")
        j = jobs.get(run.job)
        # progress as the processes show it (their newest checkpoint), not as the API does
        ckpt = max((d.name for d in (run.workdir / "checkpoints").glob("step_*")), default=None)
        if ckpt != run.newest_checkpoint:
            run.newest_checkpoint, run.progress_at = ckpt, now
            self.first_step_at = self.first_step_at or now
        detail = self._get(f"/api/v1/jobs/{run.job}") if j is not None else None
        if nodes is None or (j is not None and detail is None):
            return
        api_ranks: dict[str, list[tuple[int, int]]] = {}
        for r in (detail or {}).get("ranks", []):
            if r.get("alive"):
                api_ranks.setdefault(r["node"], []).append((r["rank"], r["pid"]))
        by_name = {n["name"]: n for n in nodes}
        obs_nodes = {}
        dead = self.outside.dead
        for i, name in enumerate(self.names):
            launcher = run.procs[i] if i < len(run.procs) else None
            alive = launcher is not None and launcher.poll() is None
            obs_nodes[name] = {
                "agent_alive": self.agents[name].poll() is None,
                "agent_since": self.agent_since[name],
                # agent_death | agent_stop while the bench holds the agent down
                "agent_down": dead["kind"] if dead is not None and dead["node"] == name else None,
                "api_status": by_name.get(name, {}).get("status"),
                "api_last_seen": by_name.get(name, {}).get("last_seen"),
                "api_cordoned": by_name.get(name, {}).get("cordoned"),
                "proc_ranks": workers(launcher.pid, self.seen) if alive and launcher else [],
                "api_ranks": sorted(api_ranks.get(name, [])),
            }
        # ended runs stay in view long enough to see the API's state outlast the launchers
        keep_s = self.relaunch_wait_s + 180.0
        obs_jobs = {
            r.job: {
                "api_state": jobs[r.job].get("state"),
                "api_ended_at": jobs[r.job].get("ended_at"),
                "ended": r.ended_at is not None,
                "ended_at": r.ended_at,
                "end": r.end,
                "launchers_alive": sum(1 for p in r.procs if p.poll() is None),
                "exit_ok": bool(r.exit_codes) and all(c == 0 for c in r.exit_codes),
            }
            for r in self.runs
            if r.job in jobs and (r.ended_at is None or now - r.ended_at < keep_s)
        }
        for r in self.runs:
            if r.ended_at is not None and r.end_seen_at is None:
                r.end_seen_at = self._end_seen_at(r.ended_at)
            if r.job in obs_jobs:
                obs_jobs[r.job]["end_seen_at"] = r.end_seen_at
        self.observations.append({"ts": now, "job": run.job, "nodes": obs_nodes, "jobs": obs_jobs})
        self.read_goodput(now, jobs)

    def _end_seen_at(self, ended_at: float, before_s: float = 30.0) -> float | None:
        """The end, or when the agents down at it (or up to `before_s` before it, when the
        ranks were exiting) came back; None while one is still down."""
        if self.outside.dead is not None and self.outside.dead["down_at"] <= ended_at:
            return None
        backs = [
            d["back_at"]
            for d in self.outside.deaths
            if d["down_at"] <= ended_at and d["back_at"] >= ended_at - before_s
        ]
        return max([ended_at, *backs])

    def read_goodput(self, now: float, jobs: dict[str, Any]) -> None:
        """Each ended run's goodput from the API, twice GOODPUT_GAP_S apart: the first once
        the API gives the job an `ended_at`, or `relaunch_wait_s` + 30 s after its launchers
        exited if it never does. Runs the bench ended at its stop are not read."""
        for r in self.runs:
            if r.ended_at is None or r.end == STOPPED or len(r.goodput_reads) >= 2:
                continue
            j = jobs.get(r.job)
            if r.goodput_reads:
                due = now - r.goodput_reads[0]["at"] >= GOODPUT_GAP_S
            else:
                ended = j is not None and j.get("ended_at") is not None
                due = ended or now - r.ended_at >= self.relaunch_wait_s + 30.0
            if not due:
                continue
            g = self._get(f"/api/v1/jobs/{r.job}/goodput")
            if g is not None:
                keys = ("goodput", "elapsed_s", "productive_s", "until", "productive_steps")
                r.goodput_reads.append(
                    {
                        "at": time.time(),
                        "api_state": (j or {}).get("state"),
                        "api_ended_at": (j or {}).get("ended_at"),
                        **{k: g.get(k) for k in keys},
                    }
                )

    def settle(self) -> None:
        """Wait (at most settle_s) until no incident is open any more."""
        deadline = time.monotonic() + self.cfg.settle_s
        while time.monotonic() < deadline:
            if self._get("/api/v1/incidents", status="open", limit=1000) == []:
                return
            self.observe(self.runs[-1])
            time.sleep(1.0)

    # --- what happened -----------------------------------------------------------------

    def rank_faults(self, steps: list[Step]) -> list[Fault]:
        """The faults the ranks fired: each run's plan, and the marker file a rank writes
        just before it fires one (examples/faults.py Injector), whose first words are the time
        and the rank's pid. The rank's node: where the bench saw that pid, else the node of
        its last step before (its steps are lost while its agent is down)."""
        last: dict[tuple[str, int], list[Step]] = {}
        for s in sorted(steps, key=lambda s: s.end):
            last.setdefault((s.job, s.rank), []).append(s)
        node_of: dict[int, str] = {}
        for o in self.observations:
            for name, n in o["nodes"].items():
                node_of.update((int(pid), name) for _rank, pid, _age in n["proc_ranks"])
        out = []
        for run in self.runs:
            for f in _plan(self.cfg, run.seed):
                marker = run.workdir / "faults" / f"fault-{f.index}.fired"
                if not marker.exists():
                    continue
                words = [*marker.read_text().split(), "", ""]
                try:
                    ts = float(words[0])
                except ValueError:
                    ts = marker.stat().st_mtime
                before = [s for s in last.get((run.job, f.rank), []) if s.end <= ts]
                node = node_of.get(int(words[1])) if words[1].isdigit() else None
                node = node or (before[-1].node if before else None)
                down = any(
                    d["node"] == node and d["down_at"] <= ts <= d["back_at"]
                    for d in self.outside.deaths
                )
                out.append(Fault(f.kind, ts, run.job, node, f.rank, f.step, f.index, None, down))
        return out

    def outside_faults(self) -> list[Fault]:
        """The bench's faults from outside the job: agents killed or stopped, the user's
        SIGTERMs, and the operator's restarts the backend took (202)."""
        o = self.outside
        out = [
            Fault(d["kind"], d["down_at"], d["job"], d["node"], down_s=d["back_at"] - d["down_at"])
            for d in o.deaths
        ]
        out += [Fault("user_sigterm", x["at"], x["job"], None) for x in o.sigterms]
        out += [
            Fault("manual_restart", x["at"], x["job"], None) for x in o.posts if x["code"] == 202
        ]
        return out

    def collect(self) -> dict[str, Any]:
        """What the database and the API say, once the job and the agents stopped. The
        incidents come from GET /api/v1/incidents/{id}; from the database through the
        same function only when the server is gone (a Ctrl-C reaches it too)."""
        from sqlalchemy import create_engine

        path = (self.work / "server" / "data" / "trainguard.db").resolve()
        engine = create_engine(f"sqlite:///file:{path}?mode=ro&uri=true")
        try:
            with engine.connect() as conn:
                rows = read_database(conn)
            ids = rows.pop("incident_ids")
            rows["read_at"] = time.time()
            try:
                rows["incidents"] = [self.backend.get(f"/api/v1/incidents/{i}") for i in ids]
                rows["incidents_from"] = "api"
            except Exception:
                try:  # a server that refuses connections may still be on its way out
                    self.backend.proc.wait(15)
                except subprocess.TimeoutExpired:
                    raise ChaosError("the server stopped answering; no report") from None
                rows["incidents"] = incidents_from_database(engine, ids)
                rows["incidents_from"] = "database (the server had exited)"
        finally:
            engine.dispose()
        return rows
