"""`trainguard bench chaos`: the demo's training job under mixed seeded faults, against a
real `trainguard server`, for M minutes; then what trainguard did, judged.

Every part is a real process talking real HTTP, as in `trainguard demo`: the server
(SQLite in the bench's data dir, `recovery_engine.Backend`), one `trainguard agent
--simulate 2` process per simulated node, the NVRx Wrapper's store hosted by the bench,
and the demo job (agent/demojob.py: one ft_launcher x 2 ranks of examples/train_demo.py
per node). The job injects its own seeded faults (agent/faults.py: exception, SIGKILL,
hang, XID 79 through the node's agent), a new run of it (next seed) starts when one ends,
and the bench kills one node's agent now and then (SIGKILL, seeded node and dead time)
and starts it again. When the minutes are over the bench waits for the open incidents to
close, stops the job, the agents and the server, and reports (backend/bench/chaos_report):
incidents by status and outcome, wrongful actions, recovery p50/p99 per fault kind, the
API against the processes, and the invariants of every incident's timeline.

Every process it starts is stopped on the way out, also on Ctrl-C, SIGTERM or an error.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainguard.backend.bench.chaos_checks import Fault, Step
from trainguard.backend.bench.chaos_rows import (
    incidents_from_database,
    proc_start,
    read_database,
    workers,
)

# The mix of the job's own faults (agent/faults.py weights; "xid" is XID 79: the simulated
# GPU falls off the bus). Agent deaths come on top, from the bench.
DEFAULT_KINDS = "exception:0.3,sigkill:0.25,hang:0.2,xid:0.25"
GPUS_PER_NODE = 2
RANKS_PER_NODE = 2


class ChaosError(RuntimeError):
    """A one-line reason the bench cannot run (bad argument, missing extra, no server)."""


@dataclass
class ChaosConfig:
    minutes: float
    seed: int = 42
    nodes: int = 2
    steps: int = 800  # per job run
    faults_per_run: int = 5
    after_step: int = 20
    min_gap: int = 100  # steps between two faults of a run, at least
    step_sleep: float = 0.1
    ckpt_every: int = 20
    kinds: str = DEFAULT_KINDS
    agent_every_s: float = 90.0  # mean time between two agent deaths (0: none)
    agent_down_s: tuple[float, float] = (5.0, 25.0)  # how long an agent stays dead
    stall_s: float = 180.0  # a run without a new checkpoint for this long is stopped
    settle_s: float = 60.0  # at the end, how long to wait for open incidents to close
    observe_every_s: float = 2.0
    policy: str | None = None  # a policy TOML; None: the server's defaults, as the demo
    down_after_s: float = 15.0  # the server's node_down_after_s (its default)


def parse_config(
    minutes: str, seed: str, agent_every: str = "90", steps: str = "800", faults: str = "5"
) -> ChaosConfig:
    """The CLI's options, checked; a bad one raises ChaosError with one line."""

    def number(name: str, text: str, kind: type, lo: float, hi: float) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise ChaosError(f"--{name} takes a number, not {text!r}") from None
        if not lo <= v <= hi:
            raise ChaosError(f"--{name} must be between {lo:g} and {hi:g}, not {text}")
        return v

    cfg = ChaosConfig(
        down_after_s=_down_after_s(),
        minutes=number("minutes", minutes, float, 0.5, 24 * 60),
        seed=number("seed", seed, int, 0, 2**31 - 1),
        agent_every_s=number("agent-every", agent_every, float, 0, 86400),
        steps=number("steps", steps, int, 100, 10**6),
        faults_per_run=number("faults-per-run", faults, int, 0, 50),
    )
    if cfg.agent_every_s and cfg.agent_every_s < 2 * cfg.agent_down_s[1]:
        raise ChaosError(f"--agent-every must be 0 or at least {2 * cfg.agent_down_s[1]:g} s")
    try:
        _plan(cfg, 0)
    except ValueError as exc:
        raise ChaosError(f"bad fault plan: {exc}") from None
    return cfg


def _down_after_s() -> float:
    """The server's node_down_after_s (it runs with the bench's environment)."""
    from trainguard.backend.settings import Settings

    try:
        return float(Settings().node_down_after_s)
    except Exception as exc:
        raise ChaosError(f"bad server setting: {exc}".splitlines()[0]) from None


def _plan(cfg: ChaosConfig, run_seed: int) -> list[Any]:
    """The faults a job run injects: the plan every rank draws (agent/faults.py)."""
    from trainguard.agent import faults

    return faults.plan(
        cfg.faults_per_run,
        run_seed,
        cfg.after_step,
        cfg.steps,
        cfg.nodes * RANKS_PER_NODE,
        faults.parse_kinds(cfg.kinds),
        cfg.min_gap,
    )


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
    end: str | None = None  # exited | stalled | stopped by the bench
    newest_checkpoint: str | None = None
    progress_at: float = 0.0


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
        self.deaths: list[dict[str, Any]] = []
        self.agent_exits: list[dict[str, Any]] = []  # exits the bench did not cause
        self.dead: dict[str, Any] | None = None
        self.observations: list[dict[str, Any]] = []
        self.rng = random.Random(f"chaos-agents:{cfg.seed}")
        self.next_kill: float | None = None
        self.first_step_at: float | None = None
        self.start = self.stop_at = 0.0

    # --- processes ---------------------------------------------------------------------

    def up(self) -> None:
        from trainguard.agent import demojob
        from trainguard.agent.storehost import StoreHost
        from trainguard.backend.bench.recovery_engine import Backend

        policy = self.cfg.policy
        if policy is None:  # an empty policy file: the defaults, as `trainguard demo` runs
            policy = str(self.work / "policy.toml")
            Path(policy).write_text("# trainguard bench chaos: the default policy\n")
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
        from trainguard.agent import demojob

        n = len(self.runs) + 1
        run = JobRun(n, f"chaos-{n}", self.cfg.seed * 1000 + n, self.work / f"job-{n}", [], 0.0)
        run.procs = demojob.launch(
            run.workdir,
            [str(self.work / f"{name}.sock") for name in self.names],
            self.store.port,
            job=run.job,
            steps=self.cfg.steps,
            ckpt_every=self.cfg.ckpt_every,
            # each fault may cost a restart of its own and one for trainguard's command,
            # an agent death one more
            max_restarts=3 * self.cfg.faults_per_run + 4,
            faults=self.cfg.faults_per_run,
            fault_seed=run.seed,
            fault_after_step=self.cfg.after_step,
            fault_kinds=self.cfg.kinds,
            fault_min_gap=self.cfg.min_gap,
            step_sleep=self.cfg.step_sleep,
        )
        run.started_at = run.progress_at = time.time()
        self.runs.append(run)
        return run

    def end_run(self, run: JobRun, why: str) -> None:
        from trainguard.agent import demojob

        if run.ended_at is None:
            demojob.stop(run.procs, grace=10.0)
            run.ended_at, run.end = time.time(), why
            run.exit_codes = [p.poll() for p in run.procs]

    def down(self) -> None:
        """Stop everything still running (idempotent): the job, its leftover workers, the
        agents, the server, the store."""
        for run in self.runs:
            self.end_run(run, "stopped by the bench")
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
        next_obs = 0.0
        while time.time() < until:
            now = time.time()
            self._check_processes()
            if all(p.poll() is not None for p in run.procs):
                self.end_run(run, "exited")
                run = self.launch()
            elif now - run.progress_at > self.cfg.stall_s:
                self.end_run(run, "stalled")
                run = self.launch()
            self._agents_tick(now, until)
            if now >= next_obs:
                next_obs = now + self.cfg.observe_every_s
                self.observe(run)
            time.sleep(0.25)
        if self.dead is not None:
            self._revive()

    def _check_processes(self) -> None:
        """The server must live; an agent that exited though the bench did not kill it is
        recorded and started again."""
        code = self.backend.proc.poll()
        if code is not None:
            log = self.work / "server" / "server.log"
            raise ChaosError(f"the server exited with code {code}; see {log}")
        for name, p in self.agents.items():
            if p.poll() is not None and (self.dead is None or self.dead["node"] != name):
                self.agent_exits.append({"node": name, "code": p.returncode, "at": time.time()})
                self.start_agent(name)

    def _agents_tick(self, now: float, until: float) -> None:
        every, (lo, hi) = self.cfg.agent_every_s, self.cfg.agent_down_s
        if not every or self.first_step_at is None:
            return
        if self.next_kill is None:
            self.next_kill = self.first_step_at + self.rng.uniform(0.5, 1.0) * every
        if self.dead is None and now >= self.next_kill and now + lo < until:
            name = self.names[self.rng.randrange(len(self.names))]
            down = self.rng.uniform(lo, hi)
            self.agents[name].kill()
            self.agents[name].wait()
            self.dead = {"node": name, "killed_at": time.time(), "planned_s": down}
            self.dead["job"] = self.runs[-1].job
            self.agent_since[name] = self.dead["killed_at"]
        elif self.dead is not None and now >= self.dead["killed_at"] + self.dead["planned_s"]:
            self._revive()
            self.next_kill = time.time() + self.rng.uniform(0.5, 1.5) * every

    def _revive(self) -> None:
        assert self.dead is not None
        self.start_agent(self.dead["node"])
        self.dead["back_at"] = self.agent_since[self.dead["node"]]
        self.deaths.append(self.dead)
        self.dead = None

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
        for i, name in enumerate(self.names):
            launcher = run.procs[i] if i < len(run.procs) else None
            alive = launcher is not None and launcher.poll() is None
            obs_nodes[name] = {
                "agent_alive": self.agents[name].poll() is None,
                "agent_since": self.agent_since[name],
                "api_status": by_name.get(name, {}).get("status"),
                "api_last_seen": by_name.get(name, {}).get("last_seen"),
                "api_cordoned": by_name.get(name, {}).get("cordoned"),
                "proc_ranks": workers(launcher.pid, self.seen) if alive and launcher else [],
                "api_ranks": sorted(api_ranks.get(name, [])),
            }
        obs_jobs = {
            r.job: {
                "api_state": jobs.get(r.job, {}).get("state"),
                "ended": r.ended_at is not None,
                "exit_ok": bool(r.exit_codes) and all(c == 0 for c in r.exit_codes),
            }
            for r in self.runs
            if r.job in jobs and (r.ended_at is None or now - r.ended_at < 120)
        }
        self.observations.append({"ts": now, "job": run.job, "nodes": obs_nodes, "jobs": obs_jobs})

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
        just before it fires one (agent/faults.py Injector), whose first word is the time."""
        last: dict[tuple[str, int], list[Step]] = {}
        for s in sorted(steps, key=lambda s: s.end):
            last.setdefault((s.job, s.rank), []).append(s)
        out = []
        for run in self.runs:
            for f in _plan(self.cfg, run.seed):
                marker = run.workdir / "faults" / f"fault-{f.index}.fired"
                if not marker.exists():
                    continue
                word = (marker.read_text().split() or [""])[0]
                try:
                    ts = float(word)
                except ValueError:
                    ts = marker.stat().st_mtime
                before = [s for s in last.get((run.job, f.rank), []) if s.end <= ts]
                node = before[-1].node if before else None
                down = any(
                    d["node"] == node and d["killed_at"] <= ts <= d["back_at"] for d in self.deaths
                )
                out.append(Fault(f.kind, ts, run.job, node, f.rank, f.step, f.index, None, down))
        return out

    def agent_faults(self) -> list[Fault]:
        return [
            Fault(
                "agent_death",
                d["killed_at"],
                d["job"],
                d["node"],
                down_s=d["back_at"] - d["killed_at"],
            )
            for d in self.deaths
        ]

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


_STOPS = (signal.SIGINT, signal.SIGTERM)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(
    cfg: ChaosConfig, workdir: str | os.PathLike[str] | None = None, out: Path | None = None
) -> dict[str, Any]:
    """One bench run (see the module docstring); the report, also written to `out`."""
    from trainguard.backend.bench.chaos_report import build_report

    if out is not None and not out.parent.is_dir():
        raise ChaosError(f"--out: no directory {out.parent}")
    try:
        import nvidia_resiliency_ext  # noqa: F401
        import torch
    except ImportError as exc:
        raise ChaosError(
            f"{exc}; the bench needs the train extra: pip install 'trainguard[train]'"
        ) from None
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main else None
    tmp = None if workdir else tempfile.TemporaryDirectory(prefix="tg-chaos-")
    work = Path(workdir or tmp.name).resolve()  # type: ignore[union-attr]
    work.mkdir(parents=True, exist_ok=True)
    chaos = Chaos(work, cfg)
    interrupted = False
    load_start = os.getloadavg()
    try:
        chaos.up()
        try:
            chaos.loop()
            chaos.settle()
        except KeyboardInterrupt:
            interrupted = True  # stop at once, and report what was seen
        chaos.stop_at = time.time()
        if chaos.dead is not None:  # interrupted while an agent was dead: it stays so
            chaos.deaths.append({**chaos.dead, "back_at": chaos.stop_at})
            chaos.dead = None
        for r in chaos.runs:
            chaos.end_run(r, "stopped by the bench")
        chaos.stop_agents()  # each sends what it holds before it exits
        try:
            rows = chaos.collect()
        except Exception as exc:
            if interrupted:  # Ctrl-C also reaches the server: say so in one line
                raise ChaosError(f"interrupted, and no report: {exc}") from None
            raise
        steps = rows["steps"]
        report = build_report(
            faults=chaos.rank_faults(steps) + chaos.agent_faults(),
            incidents=rows["incidents"],
            steps=steps,
            commands=rows["commands"],
            cordons=rows["cordons"],
            node_events=rows["node_events"],
            observations=chaos.observations,
            start=chaos.start,
            stop=chaos.stop_at,
            down_after_s=cfg.down_after_s,
        )
        report["incidents"]["read_from"] = rows["incidents_from"]
    finally:
        # a second Ctrl-C must not cut the clean-up short
        held = [(n, signal.signal(n, signal.SIG_IGN)) for n in _STOPS] if main else []
        try:
            chaos.down()
        finally:
            for n, handler in held:
                signal.signal(n, handler)
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            if tmp is not None:
                tmp.cleanup()
    report = {
        "bench": "chaos",
        "interrupted": interrupted,
        "config": {
            **asdict(cfg),
            "world": cfg.nodes * RANKS_PER_NODE,
            "workdir": str(work) if workdir else None,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_start": load_start,
            "load_avg_end": os.getloadavg(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "agent_exits": chaos.agent_exits,
        "runs": [
            {
                "job": r.job,
                "fault_seed": r.seed,
                "started_at": r.started_at,
                "ended_at": r.ended_at,
                "end": r.end,
                "exit_codes": r.exit_codes,
            }
            for r in chaos.runs
        ],
        **report,
    }
    if out is not None:
        out.write_text(json.dumps(report, indent=1, default=str))
    return report
