"""The launcher matrix, for real: a `trainguard server` (SQLite in its data dir), one
`trainguard agent --simulate 2` per imitated node, and a training job under torchrun or
ft_launcher, with or without NVRx's Wrapper, that takes several faults in a row.

- torchrun: the line docs/restarts.md recommends (`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`,
  c10d rendezvous on 127.0.0.1, `--rdzv-id`); ft_launcher: backend/demojob.py's command
  (the flags the installed ft_launcher accepts).
- Without the Wrapper the script is examples/train_user.py (written from the README's SDK
  snippet); with it, examples/train_demo.py (the Wrapper's store hosted by the first
  node's agent). Both run under backend/bench/inject.py, which fires the faults a test
  asks for.
- One node: one agent on the well-known socket (its folders moved under the test's own
  with TRAINGUARD_SOCKET_DIRS) and ranks with no trainguard setting. Two nodes: two
  agents and two launchers with `--nnodes 2` on this machine, each launcher's workers
  pointed at their own agent (TRAINGUARD_AGENT_SOCKET).
- The job is named by `--rdzv-id` alone (no TRAINGUARD_JOB).
- A `pool` cell runs each agent with `--pool 2` (agent/worker/) and starts the workers
  through the shim (`--no-python trainguard-worker inject.py ...`): every generation is
  forked from the warm pool (`Stack.pool_served` counts them).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.invariants import check
from tests.support import AUTH, TOKEN, free_port, wait_for
from trainguard.backend import demojob
from trainguard.worker import pool_path_for
from trainguard.worker.supervisor import query

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
INJECT = ROOT / "backend" / "bench" / "inject.py"  # the bench shares it (gpucheck)
USER_SCRIPT = ROOT / "examples" / "train_user.py"
DEMO_SCRIPT = ROOT / "examples" / "train_demo.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
PER_NODE = 2
COOLDOWN_S = 10.0  # backend/policy/default.toml [limits] cooldown_s
# What a user's shell may hold that would bypass discovery or name the job.
SETTINGS = ("TRAINGUARD_AGENT_SOCKET", "TRAINGUARD_AGENT_SOCKET_PATH", "TRAINGUARD_JOB")

FAULTS = ("exception", "sigkill", "hang", "rest_in_process", "rest_launcher")
# The root cause of each fault's incident. A SIGKILL's may be a survivor's exception: its
# gloo "Connection reset by peer" can be reported a few ms before the agent sees the exit
# (the rank_exit then joins the incident and sets its level).
CAUSES: dict[str, tuple[str, ...]] = {
    "exception": ("exception",),
    "sigkill": ("rank_exit", "exception"),
    "hang": ("hang",),
    "rest_in_process": ("operator",),
    "rest_launcher": ("operator",),
    "rest_launcher_force": ("operator",),  # past the launcher's budget guard (force: true)
}


@dataclass(frozen=True)
class Cell:
    launcher: str  # torchrun | ft_launcher
    wrapper: bool
    nodes: int
    pool: bool = False  # workers through the shim, warm from the agent's pool

    @property
    def id(self) -> str:
        kind = "wrapper" if self.wrapper else "plain"
        return f"{self.launcher}-{kind}-{self.nodes}n{'-pool' if self.pool else ''}"

    @property
    def world(self) -> int:
        return self.nodes * PER_NODE

    def expected(self, fault: str) -> str:
        """The incident's level, or "409" for a REST level the job cannot carry out."""
        if fault == "rest_in_process":
            return "in_process" if self.wrapper else "409"
        if fault in ("rest_launcher", "sigkill"):
            return "launcher"  # a lost rank ends the Wrapper (min world = the full world)
        return "in_process" if self.wrapper else "launcher"  # exception, hang

    def fault_rank(self, fault: str) -> int:
        """Rank 1 (node 0) raises or hangs; the last rank (the last node) is killed."""
        return self.world - 1 if fault == "sigkill" else 1


CELLS = [
    Cell(launcher, wrapper, nodes)
    for launcher in ("torchrun", "ft_launcher")
    for wrapper in (False, True)
    for nodes in (1, 2)
]
# The launcher tests with the warm pool on, one cell per launcher.
POOL_CELLS = [Cell("torchrun", False, 1, pool=True), Cell("ft_launcher", True, 2, pool=True)]


@dataclass
class Outcome:
    cell: str
    fault: str
    expected: str
    incident: dict[str, Any] | None = None
    status_code: int = 202
    detail: str = ""  # a refusal's reason
    extra_incidents: list[dict[str, Any]] = field(default_factory=list)

    @property
    def recovery_s(self) -> float | None:
        return self.incident.get("recovery_s") if self.incident else None

    def line(self) -> str:
        if self.incident is None:
            return f"{self.cell} {self.fault}: {self.status_code} (expected {self.expected})"
        i = self.incident
        rec = f"{i['recovery_s']:.2f} s" if i.get("recovery_s") is not None else "-"
        return (
            f"{self.cell} {self.fault}: incident {i['id']} cause {i['cause']} level "
            f"{i['level']} {i['status']} recovery {rec} (expected {self.expected}); "
            f"{i['outcome'][:100]}"
        )


class Stack:
    """The processes of one matrix job, and its REST API."""

    def __init__(
        self,
        tmp: Path,
        cell: Cell,
        max_restarts: int = 6,
        expect: dict[str, str] | None = None,
        policy: str = "",
        steps: int = 100000,
    ) -> None:
        """`policy`: policy-file text over the defaults for the server (none: the defaults);
        `steps`: the job's training steps (the default: more than any test waits for)."""
        self.tmp, self.cell, self.max_restarts = tmp, cell, max_restarts
        self.policy, self.steps = policy, steps
        # A fault's expected outcome where it differs from the cell's (the budget's 409).
        self.expect = expect or {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data = tmp / "data"
        self.faults = tmp / "faults"
        self.faults.mkdir(parents=True, exist_ok=True)
        self.work = tmp / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.socket_dirs = f"{tmp / 'run'}{os.pathsep}{tmp / 'user'}"
        self.store_port = demojob.free_port() if cell.wrapper else None
        self.job = f"mx-{cell.id}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.launchers: list[subprocess.Popen[bytes]] = []
        self.env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
        self.env.update(
            TRAINGUARD_ADMIN_TOKEN=TOKEN,
            TRAINGUARD_SOCKET_DIRS=self.socket_dirs,
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
        )
        self.http = httpx.Client(base_url=f"{self.url}/api/v1", headers=AUTH, timeout=20)

    @property
    def db_url(self) -> str:
        return f"sqlite:///{self.data / 'trainguard.db'}"

    # --- processes ----------------------------------------------------------------

    def start(self, name: str, cmd: list[str], **extra: str) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{name}.log").open("ab")
        p = subprocess.Popen(
            cmd,
            env={**self.env, **extra},
            cwd=str(self.work),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs.append(p)
        return p

    def summary(self) -> str:
        """The job, its exits and its incidents as the server has them: printed before
        the logs when a test fails, so a cut output still shows them."""
        try:
            job = self.get(f"/jobs/{self.job}")
            exits = self.get("/events", job=self.job, kind="rank_exit")
            incs = self.incidents()
        except (httpx.HTTPError, OSError) as exc:
            return f"--- summary: the server did not answer ({exc})"
        lines = [f"--- summary: job {job['state']} ({job.get('state_reason')})"]
        lines += [f"exit {e['node']} rank {e['rank']}: {e['message']} {e['data']}" for e in exits]
        lines += [f"incident {i['id']} {i['cause']} {i['status']}: {i['outcome']}" for i in incs]
        return "\n".join(lines)

    def logs(self, tail: int = 4000) -> str:
        return "\n".join(
            f"--- {f.name}\n{f.read_text(errors='replace')[-tail:]}"
            for f in sorted(self.tmp.glob("*.log"))
        )

    def server(self) -> None:
        extra = {"TRAINGUARD_DATA_DIR": str(self.data)}
        if self.policy:
            (self.tmp / "policy.toml").write_text(self.policy)
            extra["TRAINGUARD_POLICY_FILE"] = str(self.tmp / "policy.toml")
        p = self.start(
            "server",
            [
                *(sys.executable, "-m", "trainguard.agent.cli", "server"),
                *("--port", str(self.port), "--log-level", "warning"),
            ],
            **extra,
        )

        def ready() -> bool:
            assert p.poll() is None, self.logs()
            try:
                return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, 90, 0.2)

    def agent_socket(self, i: int) -> Path | None:
        """Node i's socket: the well-known one for a one-node cell (None: discovered)."""
        return None if self.cell.nodes == 1 else self.tmp / f"node{i}.sock"

    def agents(self) -> None:
        for i in range(self.cell.nodes):
            extra = {"TRAINGUARD_AGENT_SPOOL_DIR": str(self.tmp / f"spool{i}")}
            sock = self.agent_socket(i)
            if sock is not None:
                extra["TRAINGUARD_AGENT_SOCKET_PATH"] = str(sock)
            if i == 0 and self.store_port:
                extra["TRAINGUARD_AGENT_STORE_PORT"] = str(self.store_port)
            self.start(
                f"agent{i}",
                [
                    *(sys.executable, "-m", "trainguard.agent.cli", "agent", "--server", self.url),
                    *("--token", TOKEN, "--node", f"mx-node{i}", "--simulate", "2"),
                    *("--interval", "0.5"),
                    *(("--pool", str(PER_NODE)) if self.cell.pool else ()),
                ],
                **extra,
            )
        log0 = self.tmp / "agent0.log"
        wait_for(lambda: "started:" in log0.read_text(errors="replace"), 60, 0.2)
        if self.cell.nodes == 2:
            for i in range(2):
                wait_for(lambda i=i: self.agent_socket(i).exists(), 60, 0.1)  # type: ignore[union-attr]  # not None with 2 nodes
        if self.cell.pool:  # the job starts once every pool is full, so its start is warm
            for i in range(self.cell.nodes):
                wait_for(
                    lambda i=i: (st := query(self.pool_socket(i))) and len(st["idle"]) >= PER_NODE,
                    120,
                    0.2,
                )

    def pool_socket(self, i: int) -> str:
        sock = self.agent_socket(i)
        return pool_path_for(sock if sock is not None else self.tmp / "run" / "agent.sock")

    def pool_served(self) -> int:
        """Workers the nodes' pools started warm so far."""
        stats = [query(self.pool_socket(i)) for i in range(self.cell.nodes)]
        return sum(st["served"] for st in stats if st)

    def script_args(self) -> list[str]:
        if self.cell.wrapper:
            return [
                str(DEMO_SCRIPT),
                *("--steps", str(self.steps), "--ckpt-every", "10", "--workdir", str(self.work)),
                *("--store-port", str(self.store_port), "--step-sleep", "0.05"),
                # Not the demo's 5 s: that timeout is also the re-entry's store wait, and
                # on 2 busy cores ranks re-entered more than 5 s apart (2 of 3 exceptions
                # and one start then failed twice and ended in a launcher restart, ~52 s)
                *("--gloo-timeout", "15"),
            ]
        return [
            str(USER_SCRIPT),
            *("--steps", str(self.steps), "--ckpt-every", "10"),
            *("--ckpt-dir", str(self.work / "ckpt")),
            *("--step-time", "0.05"),
        ]

    def launch(self) -> None:
        rdzv = demojob.free_port()
        for i in range(self.cell.nodes):
            extra = {"TRAINGUARD_TEST_FAULTS": str(self.faults), "OMP_NUM_THREADS": "1"}
            sock = self.agent_socket(i)
            if sock is not None:
                extra["TRAINGUARD_AGENT_SOCKET"] = str(sock)
            if self.cell.launcher == "torchrun":
                extra["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
                cmd = [
                    str(TORCHRUN),
                    *("--nnodes", str(self.cell.nodes), "--nproc-per-node", str(PER_NODE)),
                    *("--max-restarts", str(self.max_restarts), "--rdzv-backend", "c10d"),
                    *("--rdzv-endpoint", f"127.0.0.1:{rdzv}", "--rdzv-id", self.job),
                    *(demojob.worker_shim() if self.cell.pool else ()),
                    str(INJECT),
                    *self.script_args(),
                ]
            else:
                extra.update(demojob.simulation_env(self.cell.nodes))
                cmd = demojob.launcher_command(
                    self.cell.nodes,
                    PER_NODE,
                    rdzv,
                    self.job,
                    self.max_restarts,
                    self.script_args(),
                    script=INJECT,
                    shim=self.cell.pool,
                )
            self.launchers.append(self.start(f"launcher{i}", cmd, **extra))

    @contextlib.contextmanager
    def running(self) -> Iterator[Stack]:
        """The server, the agents and the launchers started; the invariants checked when
        the test's block ends well, the logs printed when it does not; everything stopped."""
        try:
            self.server()
            self.agents()
            self.launch()
            yield self
            check(self.db_url)
        except BaseException:
            print(self.summary())
            print(self.logs())
            raise
        finally:
            self.close()

    def close(self) -> None:
        demojob.stop(self.launchers, grace=10)
        for p in reversed(self.procs):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        self.http.close()

    # --- the REST API ---------------------------------------------------------------

    def get(self, path: str, **params: Any) -> Any:
        r = self.http.get(path, params=params)
        r.raise_for_status()
        return r.json()

    def ranks(self) -> list[dict[str, Any]]:
        try:
            return list(self.get(f"/jobs/{self.job}")["ranks"])
        except httpx.HTTPStatusError:
            return []

    def incidents(self) -> list[dict[str, Any]]:
        return list(self.get("/incidents", job=self.job))

    def incident(self, id_: int) -> dict[str, Any]:
        return dict(self.get(f"/incidents/{id_}"))

    def restart(self, level: str, force: bool = False) -> httpx.Response:
        body: dict[str, Any] = {"level": level, "reason": f"matrix {level}"}
        if force:
            body["force"] = True
        return self.http.post(f"/jobs/{self.job}/restarts", json=body)

    # --- following the job ----------------------------------------------------------

    def live(self, after: float = 0.0, steps: int = 12) -> list[dict[str, Any]] | None:
        """Every rank of the job alive, each with `steps` steps done since `after` (so a
        checkpoint exists): the ranks, else None. (Not "one attempt": under torchrun on
        two nodes only the failed node's agent counts a restart.)"""
        ranks = [r for r in self.ranks() if r["alive"]]
        if len(ranks) != self.cell.world or len({r["rank"] for r in ranks}) != self.cell.world:
            return None
        steps_now = self.get(f"/jobs/{self.job}/steps", since=after, limit=10000)
        done: dict[int, set[int]] = {}
        cols = steps_now.get("columns", steps_now)
        for rank, step in zip(cols.get("rank", []), cols.get("step", []), strict=False):
            done.setdefault(rank, set()).add(step)
        if any(len(done.get(r["rank"], ())) < steps for r in ranks):
            return None
        return ranks

    def wait_live(self, after: float = 0.0, timeout: float = 240) -> list[dict[str, Any]]:
        def check() -> list[dict[str, Any]] | None:
            for p in self.launchers:
                assert p.poll() is None, f"a launcher exited ({p.returncode})\n{self.logs()}"
            return self.live(after)

        return wait_for(check, timeout, 0.5)

    def fault(self, fault: str, ranks: list[dict[str, Any]]) -> httpx.Response | None:
        target = self.cell.fault_rank(fault)
        if fault in ("exception", "hang", "xid"):
            (self.faults / f"{fault}.{target}").write_text("")
        elif fault == "sigkill":
            (pid,) = [r["pid"] for r in ranks if r["rank"] == target]
            os.kill(pid, signal.SIGKILL)
        elif fault == "rest_launcher_force":
            return self.restart("launcher", force=True)
        else:
            return self.restart(fault.removeprefix("rest_"))
        return None

    def follow(self, fault: str) -> Outcome:
        """One fault, on a live job: its incident once it is closed (or the 409)."""
        expected = self.expect.get(fault) or self.cell.expected(fault.removesuffix("_force"))
        out = Outcome(self.cell.id, fault, expected)
        ranks = self.wait_live()
        seen = {i["id"] for i in self.incidents()}
        last_acted = max((i["acted_at"] or 0 for i in self.incidents()), default=0.0)
        wait_for(lambda: time.time() >= last_acted + COOLDOWN_S + 0.5, COOLDOWN_S + 5, 0.2)
        t0 = time.time()
        r = self.fault(fault, ranks)
        if r is not None:
            out.status_code = r.status_code
            out.detail = r.json().get("detail", "") if r.status_code >= 400 else ""
            if r.status_code == 409:  # refused, and nothing changed
                assert {i["id"] for i in self.incidents()} == seen
                assert {(x["rank"], x["pid"]) for x in self.wait_live()} == {
                    (x["rank"], x["pid"]) for x in ranks
                }
                return out
            assert r.status_code == 202, r.text
        new = wait_for(lambda: [i for i in self.incidents() if i["id"] not in seen], 120, 0.3)
        first = min(new, key=lambda i: i["id"])

        def closed() -> dict[str, Any] | None:
            inc = self.incident(first["id"])
            return inc if inc["status"] != "open" else None

        out.incident = wait_for(closed, 300, 0.5)
        self.wait_live(after=t0)  # the job steps again in its new generation
        out.extra_incidents = [
            i for i in self.incidents() if i["id"] not in seen and i["id"] != first["id"]
        ]
        return out


def record(outcomes: list[Outcome]) -> None:
    """One JSON line per fault in $TRAINGUARD_MATRIX_OUT when set (docs/restarts.md's table)."""
    path = os.environ.get("TRAINGUARD_MATRIX_OUT")
    for o in outcomes:
        print(o.line(), flush=True)
        if path:
            with open(path, "a") as f:
                inc = o.incident or {}
                f.write(
                    json.dumps(
                        {
                            "cell": o.cell,
                            "fault": o.fault,
                            "expected": o.expected,
                            "status_code": o.status_code,
                            "cause": inc.get("cause"),
                            "level": inc.get("level"),
                            "status": inc.get("status"),
                            "recovery_s": inc.get("recovery_s"),
                            "outcome": inc.get("outcome"),
                            "extra": len(o.extra_incidents),
                        }
                    )
                    + "\n"
                )
