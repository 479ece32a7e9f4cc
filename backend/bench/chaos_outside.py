"""The faults `trainguard bench chaos` brings from outside the job (the runner is
backend/bench/chaos_procs.py; the mix is `--bench-kinds`, chaos_config.py): one at a time,
the first 0.5-1 x `--bench-every` after the job's first checkpoint, each next one 0.5-1.5 x
after the last ended (an agent back, the operator done), all drawn from the seed:

- agent_death: SIGKILL to one node's agent (seeded node), started again after 5-25 s;
- agent_stop: SIGTERM to it, a graceful stop (`systemctl stop`, an upgrade): its last batch
  says `going_away`; started again after 30-90 s. Its node must read `agent_down`, never
  be cordoned for it, and come back by itself (docs/engine.md, "Agent silence is not
  node death");
- user_sigterm: SIGTERM to the job's launcher on every node, as `scancel` or Ctrl-C
  would; the run ends when they exit and the next starts, as after any run's end;
- manual_restart: the bench's operator posts launcher restarts (POST
  /api/v1/jobs/{job}/restarts) until the backend refuses one for the launcher's restart
  budget (409, code `restart_budget`): on a run launched with the small --max-restarts at
  most that many plus one, each after the last resumed, on other runs one. A refusal is
  forced (`force: true`) with a seeded chance. Each answer is kept with the budget the
  launchers' processes had, read from /proc before and after the post (their
  TORCHELASTIC_MAX_RESTARTS and TORCHELASTIC_RESTART_COUNT), which the report judges it by.
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

from trainguard.backend.bench.chaos_config import RANKS_PER_NODE, budget_run, parse_bench_kinds
from trainguard.backend.bench.chaos_rows import proc_budget

if TYPE_CHECKING:
    from trainguard.backend.bench.chaos_procs import Chaos, JobRun

OPERATOR_REASON = "trainguard bench chaos: the operator's restart"
GOODBYE_WAIT_S = 15.0  # how long a stopped agent may take to send its last batch and exit
SIGTERM_WAIT_S = 60.0  # launchers still running this long after the user's SIGTERM: killed


class Outside:
    """The bench's faults from outside the job, and what it recorded of them."""

    def __init__(self, chaos: Chaos) -> None:
        self.chaos = chaos
        self.weights = parse_bench_kinds(chaos.cfg.bench_kinds)
        self.rng = random.Random(f"chaos-outside:{chaos.cfg.seed}")
        self.next_at: float | None = None
        self.dead: dict[str, Any] | None = None  # an agent killed or stopped, until it is back
        self.deaths: list[dict[str, Any]] = []  # agents killed or stopped, each with back_at
        self.sigterms: list[dict[str, Any]] = []  # the user's SIGTERMs of a job's launchers
        self.posts: list[dict[str, Any]] = []  # the operator's restart requests, answered
        self.operator: threading.Thread | None = None
        self.over = threading.Event()  # the chaos phase is over: the operator stops

    def _schedule(self, now: float) -> None:
        self.next_at = now + self.rng.uniform(0.5, 1.5) * self.chaos.cfg.bench_every_s

    def tick(self, now: float, until: float) -> None:
        """One look from the runner's loop: end the fault under way, or start the next."""
        cfg = self.chaos.cfg
        if not cfg.bench_every_s or not self.weights or self.chaos.first_step_at is None:
            return
        if self.dead is not None:
            if now >= self.dead["down_at"] + self.dead["planned_s"]:
                self.revive()
                self._schedule(time.time())
            return
        if self.operator is not None:
            if not self.operator.is_alive():
                self.operator = None
                self._schedule(time.time())
            return
        if self.next_at is None:
            self.next_at = self.chaos.first_step_at + self.rng.uniform(0.5, 1.0) * cfg.bench_every_s
        run = self.chaos.runs[-1]
        if now < self.next_at:
            return
        if run.ended_at is not None or run.sigterm_at is not None or not run.newest_checkpoint:
            self.next_at = now + 5.0  # wait for a run that trains
            return
        kind = self.rng.choices(list(self.weights), list(self.weights.values()))[0]
        lo = (cfg.agent_down_s if kind == "agent_death" else cfg.agent_stop_s)[0]
        if now + (lo if kind in ("agent_death", "agent_stop") else 10.0) >= until:
            self.next_at = until  # no time left for it
            return
        if kind in ("agent_death", "agent_stop"):
            self._agent_down(kind, run)
        elif kind == "user_sigterm":
            self._sigterm(run)
            self._schedule(time.time())
        else:
            force = self.rng.random() < cfg.force_share
            posts = cfg.small_max_restarts + 1 if budget_run(cfg, run.n) else 1
            self.operator = threading.Thread(
                target=self._operate, args=(run, posts, force), name="chaos-operator", daemon=True
            )
            self.operator.start()

    # --- agents ------------------------------------------------------------------------

    def _agent_down(self, kind: str, run: JobRun) -> None:
        cfg, names = self.chaos.cfg, self.chaos.names
        name = names[self.rng.randrange(len(names))]
        lo, hi = cfg.agent_down_s if kind == "agent_death" else cfg.agent_stop_s
        down = self.rng.uniform(lo, hi)
        p = self.chaos.agents[name]
        at = time.time()
        if kind == "agent_death":
            p.kill()
            p.wait()
        else:
            p.terminate()  # the agent sends its last batch, with going_away, and exits
            try:
                p.wait(GOODBYE_WAIT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.dead = {
            "kind": kind,
            "node": name,
            "down_at": at,
            "exited_at": time.time(),
            "exit_code": p.returncode,
            "planned_s": down,
            "job": run.job,
        }
        self.chaos.agent_since[name] = at

    def revive(self) -> None:
        """Start the dead agent again (same spool and socket)."""
        assert self.dead is not None
        self.chaos.start_agent(self.dead["node"])
        self.dead["back_at"] = self.chaos.agent_since[self.dead["node"]]
        self.deaths.append(self.dead)
        self.dead = None

    # --- the user's SIGTERM ------------------------------------------------------------

    def _sigterm(self, run: JobRun) -> None:
        at = time.time()
        pids = []
        for p in run.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                pids.append(p.pid)
        run.sigterm_at = at
        self.sigterms.append({"job": run.job, "at": at, "launchers": pids})

    # --- the operator's restarts -------------------------------------------------------

    def _operate(self, run: JobRun, posts: int, force: bool) -> None:
        """Launcher restarts until one is refused for the budget (then forced, if `force`),
        at most `posts`, each once the job trains (its workers past their start-up: an
        operator restarts a job that runs) and after the last one's incident closed."""
        for _ in range(posts):
            if not self._trains(run):
                return
            row = self._post(run, force=False)
            if row["code"] == 409 and row["body_code"] == "restart_budget":
                if force:
                    self._post(run, force=True)
                return
            if row["code"] != 202 or row["incident"] is None:
                return
            self._wait_resumed(run, row["incident"])

    def _post(self, run: JobRun, force: bool) -> dict[str, Any]:
        launchers = [p.pid for p in run.procs if p.poll() is None]
        seen = self.chaos.seen
        api = self.chaos._get(f"/api/v1/jobs/{run.job}") or {}
        before = proc_budget(launchers, seen)
        at = time.time()
        try:
            code, body = self.chaos.backend.post(
                f"/api/v1/jobs/{run.job}/restarts",
                {"level": "launcher", "reason": OPERATOR_REASON, "force": force},
            )
        except Exception as exc:  # a busy server: recorded, not judged
            code, body = None, {"detail": str(exc)}
        body = body if isinstance(body, dict) else {"detail": str(body)}
        row = {
            "job": run.job,
            "run": run.n,
            "max_restarts": run.max_restarts,
            "at": at,
            "force": force,
            "code": code,
            "body_code": body.get("code"),
            "incident": body.get("incident_id"),
            "detail": str(body.get("detail") or "")[:300],
            "api_restarts_left": api.get("restarts_left"),
            "proc_before": before,
            "proc_after": proc_budget(launchers, seen),
        }
        self.posts.append(row)
        return row

    def _trains(self, run: JobRun, timeout_s: float = 120.0) -> bool:
        """Wait until every launcher of the run has its workers, all past their start-up
        (the backend has heard of them); False when the run ends or the phase is over
        first, or after `timeout_s`."""
        from trainguard.backend.bench.chaos_report import STARTUP_S

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.over.is_set() or run.ended_at is not None or run.sigterm_at is not None:
                return False
            launchers = [p.pid for p in run.procs if p.poll() is None]
            budget = proc_budget(launchers, self.chaos.seen)
            if (
                len(launchers) == len(run.procs)
                and budget is not None
                and budget["workers"] == len(launchers) * RANKS_PER_NODE
                and budget["youngest_s"] >= STARTUP_S + 5
            ):
                return True
            time.sleep(1.0)
        return False

    def _wait_resumed(self, run: JobRun, incident: int, timeout_s: float = 150.0) -> None:
        """Until the restart's incident closed, at most `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and run.ended_at is None and run.sigterm_at is None:
            if self.over.is_set():
                return
            inc = self.chaos._get(f"/api/v1/incidents/{incident}") or {}
            if inc.get("status") not in (None, "open"):
                return
            time.sleep(1.0)

    def finish(self) -> None:
        """The chaos phase is over: the dead agent back, the operator done."""
        self.over.set()
        if self.dead is not None:
            self.revive()
        if self.operator is not None:
            self.operator.join(60)
