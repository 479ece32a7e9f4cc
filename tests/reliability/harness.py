"""Real processes for the fault tests: `trainguard server` and `trainguard agent
--simulate` on loopback ports, a private PostgreSQL cluster, and the checks that what the
agents sent is stored exactly once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from tests.support import TOKEN, free_port, spooled_samples, wait_for
from trainguard.backend.tokens import service as tokens

ADMIN = {"Authorization": f"Bearer {TOKEN}"}
ROOT = Path(__file__).resolve().parents[2]


class Procs:
    """Processes of one test, each logging to `<tmp>/<name>.log`; all ended at teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """`trainguard <args>` as a process."""
        return self.spawn(name, [sys.executable, "-m", "trainguard.agent.cli", *args], env)

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.tmp / f"{name}.log").open("ab") as log:
            p = subprocess.Popen(
                argv,
                env={**os.environ, "TRAINGUARD_ADMIN_TOKEN": TOKEN, "PYTHONPATH": str(ROOT), **env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(p)
        return p

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    @staticmethod
    def stop(p: subprocess.Popen[bytes], timeout: float = 20.0) -> int:
        """SIGTERM (an agent flushes its outbox), SIGKILL after `timeout`."""
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return int(p.returncode)

    @staticmethod
    def kill(p: subprocess.Popen[bytes]) -> None:
        p.kill()
        p.wait(10)

    def close(self) -> None:
        for p in reversed(self.procs):
            self.stop(p, 10)


@dataclass
class Backend:
    procs: Procs
    port: int
    env: dict[str, str]
    name: str = "server"
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Backend:
        self.proc = self.procs.start(
            self.name, "server", "--port", str(self.port), "--log-level", "info", env=self.env
        )
        proc = self.proc

        def ready() -> bool:
            assert proc.poll() is None, self.procs.log(self.name)[-4000:]
            try:
                return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, 60, 0.1)
        return self

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=f"{self.url}/api/v1", headers=ADMIN, timeout=10)

    def statuses(self) -> dict[int, int]:
        """HTTP statuses in the access log so far, counted."""
        counts: dict[int, int] = defaultdict(int)
        for line in self.procs.log(self.name).splitlines():
            if '" ' in line and "HTTP/1.1" in line:
                code = line.rsplit('" ', 1)[1].split(" ", 1)[0]
                if code.isdigit():
                    counts[int(code)] += 1
        return dict(counts)


@dataclass
class Agent:
    procs: Procs
    node: str
    token: str
    port: int
    gpus: int = 2
    interval: float = 0.2
    spool_max_bytes: int | None = None
    runs: int = 0
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def spool(self) -> Path:
        return self.procs.tmp / "spool" / self.node

    @property
    def log_name(self) -> str:
        return f"agent-{self.node}"

    def start(self) -> Agent:
        self.runs += 1
        env = {
            "TRAINGUARD_AGENT_SPOOL_DIR": str(self.spool),
            "TRAINGUARD_AGENT_SOCKET_PATH": str(self.procs.tmp / f"{self.node}.sock"),
            "TRAINGUARD_AGENT_SEED": "7",
        }
        if self.spool_max_bytes is not None:
            env["TRAINGUARD_AGENT_SPOOL_MAX_BYTES"] = str(self.spool_max_bytes)
        self.proc = self.procs.start(
            self.log_name,
            "agent",
            "--server",
            f"http://127.0.0.1:{self.port}",
            "--token",
            self.token,
            "--node",
            self.node,
            "--simulate",
            str(self.gpus),
            "--interval",
            str(self.interval),
            env=env,
        )
        return self

    def spooled(self) -> int:
        """Batches in the spool (an outage's batches never sent share one:
        agent/uplink/sender.py)."""
        return len(list(self.spool.glob("*.batch"))) if self.spool.is_dir() else 0

    def spooled_ticks(self) -> int:
        """Ticks' worth of samples in the spool (a tick samples every GPU once)."""
        return spooled_samples(self.spool) // self.gpus

    def stop(self) -> int:
        assert self.proc is not None
        return Procs.stop(self.proc)


def agent_tokens(url: str, nodes: list[str]) -> dict[str, str]:
    """An agent token bound to each node, made through the real token service."""
    engine = create_engine(url)
    with Session(engine) as session:
        made = {n: tokens.create(session, "agent", n, n).token for n in nodes}
        session.commit()
    engine.dispose()
    return made


def batches_stored(url: str) -> dict[str, int]:
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT n.name, COUNT(*) FROM ingest_batches b JOIN nodes n ON n.id = b.node_id "
                "GROUP BY n.name"
            )
        ).all()
    engine.dispose()
    return {name: int(c) for name, c in rows}


@dataclass
class Ledger:
    """What the database holds, per node, to check exactly-once delivery."""

    seqs: dict[tuple[str, str], list[int]]  # (node, agent_id) -> stored seqs, sorted
    batch_samples: int  # sum of the samples each stored batch claims
    samples: int  # rows in samples
    duplicate_samples: int  # (gpu, ts) pairs stored more than once
    ticks: dict[str, list[tuple[float, int]]]  # node -> [(ts, GPUs sampled at ts)]
    events: dict[tuple[str, str], int]  # (node, kind) -> count
    gaps: list[dict[str, Any]]  # spool_gap events' data

    @classmethod
    def read(cls, url: str) -> Ledger:
        engine = create_engine(url)
        with engine.connect() as conn:
            seqs: dict[tuple[str, str], list[int]] = defaultdict(list)
            for node, agent_id, seq in conn.execute(
                text(
                    "SELECT n.name, b.agent_id, b.seq FROM ingest_batches b "
                    "JOIN nodes n ON n.id = b.node_id ORDER BY n.name, b.agent_id, b.seq"
                )
            ):
                seqs[(node, agent_id)].append(int(seq))
            batch_samples = conn.execute(
                text("SELECT COALESCE(SUM(samples), 0) FROM ingest_batches")
            ).scalar_one()
            samples = conn.execute(text("SELECT COUNT(*) FROM samples")).scalar_one()
            dupes = conn.execute(
                text(
                    "SELECT COUNT(*) FROM (SELECT gpu_id, ts FROM samples "
                    "GROUP BY gpu_id, ts HAVING COUNT(*) > 1) d"
                )
            ).scalar_one()
            ticks: dict[str, list[tuple[float, int]]] = defaultdict(list)
            for node, ts, n in conn.execute(
                text(
                    "SELECT n.name, s.ts, COUNT(*) FROM samples s JOIN gpus g ON g.id = s.gpu_id "
                    "JOIN nodes n ON n.id = g.node_id GROUP BY n.name, s.ts ORDER BY n.name, s.ts"
                )
            ):
                ticks[node].append((float(ts), int(n)))
            events = {
                (node, kind): int(c)
                for node, kind, c in conn.execute(
                    text(
                        "SELECT n.name, e.kind, COUNT(*) FROM events e JOIN nodes n "
                        "ON n.id = e.node_id GROUP BY n.name, e.kind"
                    )
                )
            }
            gaps = [
                d if isinstance(d, dict) else json.loads(d)
                for (d,) in conn.execute(text("SELECT data FROM events WHERE kind = 'spool_gap'"))
            ]
        engine.dispose()
        return cls(
            dict(seqs), int(batch_samples), int(samples), int(dupes), dict(ticks), events, gaps
        )

    def assert_exactly_once(self, agents: list[Agent], max_tick_gap_s: float) -> None:
        """Every batch of every agent process stored once, none missing, every tick whole."""
        for a in agents:
            runs = {aid: s for (node, aid), s in self.seqs.items() if node == a.node}
            assert len(runs) == a.runs, f"{a.node}: {len(runs)} agent processes, want {a.runs}"
            for aid, s in runs.items():
                assert s == list(range(1, len(s) + 1)), f"{a.node}/{aid}: seq gaps {_gaps(s)}"
            stamps = self.ticks[a.node]
            partial = [(ts, n) for ts, n in stamps if n != a.gpus]
            assert partial == [], f"{a.node}: ticks with a GPU missing or doubled: {partial[:5]}"
            holes = [
                (round(t0, 3), round(t1 - t0, 3))
                for (t0, _), (t1, _) in pairwise(stamps)
                if t1 - t0 > max_tick_gap_s
            ]
            assert holes == [], f"{a.node}: samples missing after {holes[:5]}"
            assert self.events.get((a.node, "agent_start")) == a.runs
        assert self.duplicate_samples == 0
        assert self.samples == self.batch_samples


def _gaps(seqs: list[int]) -> list[int]:
    have = set(seqs)
    return [i for i in range(1, max(seqs) + 1) if i not in have][:10]


# --- a private PostgreSQL cluster ---------------------------------------------------------


def _pg_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PrivatePostgres:
    """A PostgreSQL cluster of the test's own (initdb into a temporary directory, a free
    port): the test can stop it without touching the shared server other tests use.
    initdb refuses to run as root; as root it runs as the `postgres` user."""

    def __init__(self) -> None:
        bindir = _pg_bin()
        if bindir is None:
            pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found")
        self.bin = bindir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="tg-pg-"))
        self.data = self.root / "data"
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            runuser = shutil.which("runuser")
            if runuser is None:
                pytest.skip("running as root without runuser: initdb cannot run")
            self.as_user = [runuser, "-u", "postgres", "--"]
            shutil.chown(self.root, "postgres")
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
        )
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self.as_user, str(self.bin / tool), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=120,
            cwd=self.root,
        )

    def start(self) -> None:
        opts = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c max_connections=60"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            opts,
            "-l",
            str(self.root / "pg.log"),
            "-w",
            "-t",
            "60",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def close(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
