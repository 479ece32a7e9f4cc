"""`trainguard bench gpu`: the device check, for the day a GPU machine is lent.

Run by deploy/gpu-check.sh (which also makes trainguard importable from a checkout on a
machine that has only Python and torch). One `trainguard server` (SQLite in a temporary
folder, the recovery bench's policy: no cooldown) and one real `trainguard agent` (NVML;
`--simulate 2` with `--cpu`, or when NVML does not start), then job runs in turn, each
taking its faults one after the other on one node:

- torchrun: examples/train_user.py (no Wrapper) under the recommended torchrun line;
- ft_launcher: examples/train_demo.py under NVRx's ft_launcher and inprocess.Wrapper
  (store hosted by the agent), with backend/demojob.py's launcher command;
- each cold (workers import torch) and warm (the agent's `--pool`, workers through the
  `trainguard-worker` shim);
- faults: an exception in the last rank's step (backend/bench/inject.py), then a SIGKILL
  of the last rank; the next fault waits until the job steps again.

The job trains on CUDA with NCCL (one rank per GPU, at most 2), or with `--cpu` on gloo.
Per fault it reports trainguard's own incident (cause, level, `recovery_s` = resumed_at -
fault_at) and the script's view: from the moment it fired the fault (wrote the fault file,
sent SIGKILL) to the end of the first step every rank completed in a newer generation,
read from the job's steps in the API. Then the agent's GPU readings over the check, read
back through the API (GET /api/v1/nodes/{node}/gpus, /api/v1/gpus/{uuid}/samples).

A missing piece (no CUDA, no NCCL, no NVRx, no NVML, a pool that does not fill) skips
what needs it with one line and the rest goes on; every wait is bounded by the overall
deadline (`--timeout`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainguard.backend import demojob

ROOT = demojob.ROOT
INJECT = ROOT / "backend" / "bench" / "inject.py"
USER_SCRIPT = ROOT / "examples" / "train_user.py"
DEMO_SCRIPT = ROOT / "examples" / "train_demo.py"
JOBS = ("torchrun-cold", "torchrun-warm", "ft_launcher-cold", "ft_launcher-warm")
FAULTS = ("exception", "sigkill")
NODE = "gpucheck"
# What a user's shell may hold that would bypass the check's own agent or name the job.
SETTINGS = ("TRAINGUARD_AGENT_SOCKET", "TRAINGUARD_AGENT_SOCKET_PATH", "TRAINGUARD_JOB")


class Skip(Exception):
    """A piece the cell needs is missing: the one line that says which."""


@dataclass
class Row:
    job: str
    fault: str
    launcher: str
    wrapper: bool
    workers: str  # cold | warm
    status: str = "skipped"  # ok | failed | skipped
    cause: str | None = None
    level: str | None = None
    recovery_s: float | None = None  # trainguard's incident
    script_s: float | None = None  # the script's view
    extra_incidents: int = 0
    note: str = ""


@dataclass
class Probe:
    """What this machine has, as the check needs it."""

    python: str = sys.version.split()[0]
    torch: str | None = None
    torch_error: str = ""
    cuda: bool = False
    devices: list[str] = field(default_factory=list)
    nccl: str | None = None
    nvrx: str | None = None
    nvrx_error: str = ""


def probe() -> Probe:
    import warnings

    p = Probe()
    # torch.cuda imports `pynvml`, which NVRx's dependency warns about at every import
    warnings.filterwarnings("ignore", "The pynvml package is deprecated", FutureWarning)
    try:
        import torch
        import torch.distributed as dist
    except Exception as exc:  # any import failure is a missing piece, not a crash
        p.torch_error = f"{type(exc).__name__}: {exc}"
        return p
    p.torch = torch.__version__
    with contextlib.suppress(Exception):
        p.cuda = bool(torch.cuda.is_available())
        if p.cuda:
            p.devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if dist.is_nccl_available():
            v = torch.cuda.nccl.version()
            p.nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    try:
        from importlib.metadata import version

        import nvidia_resiliency_ext.fault_tolerance  # noqa: F401 - ft_launcher's package
        from nvidia_resiliency_ext import inprocess  # noqa: F401 - the Wrapper

        p.nvrx = version("nvidia-resiliency-ext")
    except Exception as exc:
        p.nvrx_error = f"{type(exc).__name__}: {str(exc)[:120]}"
    return p


def why_not(job: str, pr: Probe, cpu: bool) -> str | None:
    """Why a job run cannot run here (None: it can)."""
    if pr.torch is None:
        return f"torch does not import ({pr.torch_error})"
    if not cpu and not pr.cuda:
        return (
            f"no CUDA device (torch {pr.torch}: torch.cuda.is_available() is False; "
            "--cpu runs gloo)"
        )
    if not cpu and pr.nccl is None:
        return f"no NCCL in torch {pr.torch} (torch.distributed.is_nccl_available() is False)"
    if job.startswith("ft_launcher") and pr.nvrx is None:
        return f"no NVRx (nvidia-resiliency-ext: {pr.nvrx_error})"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def wait(self, cond: Any, timeout: float, what: str, every: float = 0.3) -> Any:
        """Poll `cond` until truthy, for `timeout` seconds at most and never past the
        deadline; Skip with `what` otherwise."""
        end = time.monotonic() + min(timeout, max(0.0, self.left()))
        while True:
            val = cond()
            if val:
                return val
            if time.monotonic() >= end:
                raise Skip(f"{what} within {timeout:.0f} s" if self.left() > 0 else "out of time")
            time.sleep(every)


class Check:
    """The server, the agent and the job runs of one check."""

    def __init__(self, work: Path, *, cpu: bool, nproc: int, pool: bool, dl: Deadline) -> None:
        from trainguard.backend.bench.recovery_engine import Backend

        self.work, self.cpu, self.nproc, self.dl = work, cpu, nproc, dl
        self.env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
        self.env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        self.backend = Backend(work / "server")
        self.url, self.token = self.backend.url, self.backend.token
        self.store_port = demojob.free_port()
        self.socket = work / "agent.sock"
        self.agent: subprocess.Popen[bytes] | None = None
        self.agent_line = ""
        self.agent_note = ""
        self.pool_error = ""
        try:
            self.start_agent(simulate=cpu, pool=pool)
        except BaseException:
            self.close()
            raise

    # --- processes ------------------------------------------------------------------

    def _popen(self, name: str, cmd: list[str], **extra: str) -> subprocess.Popen[bytes]:
        log = (self.work / f"{name}.log").open("ab")
        try:
            return subprocess.Popen(
                cmd,
                env={**self.env, **extra},
                cwd=str(self.work),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()

    def log(self, name: str) -> str:
        path = self.work / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start_agent(self, *, simulate: bool, pool: bool) -> None:
        """`trainguard agent` (NVML, or `--simulate 2`); an NVML agent that does not start
        gives way to a simulated one, with the reason kept for the table."""
        cmd = [
            *(sys.executable, "-m", "trainguard.agent.cli", "agent", "--server", self.url),
            *("--token", self.token, "--node", NODE, "--interval", "0.5"),
            *("--socket", str(self.socket)),
            *(("--simulate", "2") if simulate else ()),
            *(("--pool", str(self.nproc)) if pool else ()),
        ]
        name = "agent-sim" if simulate else "agent"
        self.agent = self._popen(
            name,
            cmd,
            TRAINGUARD_AGENT_SPOOL_DIR=str(self.work / f"spool-{name}"),
            TRAINGUARD_AGENT_STORE_PORT=str(self.store_port),
        )
        agent = self.agent

        def up() -> bool:
            if agent.poll() is not None:
                raise Skip(f"exit {agent.returncode}: {_last_line(self.log(name))}")
            return "started:" in self.log(name) and self.socket.exists()

        try:
            self.dl.wait(up, 90, "the agent did not start")
        except Skip as exc:
            self.stop_agent()
            if simulate:
                raise Skip(f"the simulated agent did not start ({exc})") from None
            self.agent_note = f"NVML agent did not start ({exc}); simulated GPUs instead"
            print(f"skip: NVML readings: {self.agent_note}", flush=True)
            self.start_agent(simulate=True, pool=pool)
            return
        line = next((ln for ln in self.log(name).splitlines() if "started:" in ln), "")
        self.agent_line = line[line.find("trainguard agent") :].strip()
        if pool:
            from trainguard.worker import pool_path_for
            from trainguard.worker.supervisor import query

            path = pool_path_for(self.socket)

            def full() -> bool:
                st = query(path)
                return bool(st) and len(st["idle"]) >= self.nproc  # type: ignore[index]  # not None here

            try:
                self.dl.wait(full, 150, "the warm pool did not fill", every=0.5)
            except Skip as exc:
                self.pool_error = str(exc)
                return
        self.pool_error = ""

    def stop_agent(self) -> None:
        if self.agent is not None:
            _stop(self.agent, 15)

    def close(self) -> None:
        self.stop_agent()
        self.backend.stop()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.backend.proc.wait(15)

    # --- the API ----------------------------------------------------------------------

    def get(self, path: str, **params: Any) -> Any:
        return self.backend.get(f"/api/v1{path}", **params)

    def ranks(self, job: str) -> list[dict[str, Any]]:
        import httpx

        try:
            return [r for r in self.get(f"/jobs/{job}")["ranks"] if r["alive"]]
        except httpx.HTTPStatusError:
            return []

    def steps(self, job: str, since: float) -> list[tuple[int, int, float, float, int, int]]:
        """(rank, step, start, end, attempt, iteration) of the job's steps since `since`."""
        c = self.get(f"/jobs/{job}/steps", since=since, limit=10000)["columns"]
        return list(
            zip(
                c["rank"],
                c["step"],
                c["start"],
                c["end"],
                c["attempt"],
                c["iteration"],
                strict=False,
            )
        )

    def live(self, job: str, after: float, steps: int = 5) -> list[dict[str, Any]] | None:
        """Every rank alive and `steps` steps done by each since `after`: the ranks."""
        ranks = self.ranks(job)
        if len({r["rank"] for r in ranks}) != self.nproc:
            return None
        done: dict[int, int] = {}
        for rank, *_ in self.steps(job, after):
            done[rank] = done.get(rank, 0) + 1
        return ranks if all(done.get(r["rank"], 0) >= steps for r in ranks) else None

    def incidents(self, job: str) -> list[dict[str, Any]]:
        return sorted(self.get("/incidents", job=job, limit=1000), key=lambda i: i["id"])

    # --- a job run ----------------------------------------------------------------------

    def launch(self, job: str, launcher: str, warm: bool) -> subprocess.Popen[bytes]:
        run = self.work / job
        (run / "faults").mkdir(parents=True, exist_ok=True)
        device = (
            ("--backend", "gloo", "--device", "cpu")
            if self.cpu
            else ("--backend", "nccl", "--device", "cuda")
        )
        rdzv = demojob.free_port()
        extra = {
            "TRAINGUARD_AGENT_SOCKET": str(self.socket),
            "TRAINGUARD_TEST_FAULTS": str(run / "faults"),
        }
        if launcher == "torchrun":
            extra["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
            cmd = [
                *(sys.executable, "-m", "torch.distributed.run"),
                *("--nnodes", "1", "--nproc-per-node", str(self.nproc), "--max-restarts", "6"),
                *("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{rdzv}"),
                *("--rdzv-id", job),
                *(demojob.worker_shim() if warm else ()),
                str(INJECT),
                str(USER_SCRIPT),
                *("--steps", "100000", "--ckpt-every", "10", "--ckpt-dir", str(run / "ckpt")),
                *("--step-time", "0.05", *device),
            ]
        else:
            cmd = demojob.launcher_command(
                1,
                self.nproc,
                rdzv,
                job,
                6,
                [
                    str(DEMO_SCRIPT),
                    *("--steps", "100000", "--ckpt-every", "10", "--workdir", str(run)),
                    *("--store-port", str(self.store_port), "--step-sleep", "0.05"),
                    *("--gloo-timeout", "15", *device),
                ],
                script=INJECT,
                shim=warm,
            )
        return self._popen(f"{job}-launcher", cmd, **extra)

    def fault(self, job: str, fault: str, row: Row, proc: subprocess.Popen[bytes]) -> None:
        """Fire one fault on the live job and fill `row` from its incident and steps."""
        started = time.time()

        def running() -> list[dict[str, Any]] | None:
            if proc.poll() is not None:
                tail = _last_line(self.log(f"{job}-launcher"))
                raise Skip(f"the launcher exited ({proc.returncode}): {tail}")
            return self.live(job, 0.0)

        ranks = self.dl.wait(running, 240, "the job did not step on every rank")
        seen = {i["id"] for i in self.incidents(job)}
        before = self.steps(job, started - 600)
        gen = max(((a, it) for *_, a, it in before), default=(0, 0))
        target = self.nproc - 1
        t0 = time.time()
        if fault == "exception":
            (self.work / job / "faults" / f"exception.{target}").write_text("")
        else:
            (pid,) = [r["pid"] for r in ranks if r["rank"] == target]
            os.kill(pid, signal.SIGKILL)
        new = self.dl.wait(
            lambda: [i for i in self.incidents(job) if i["id"] not in seen], 60, "no incident"
        )
        first = new[0]["id"]
        inc = self.dl.wait(
            lambda: (i := self.get(f"/incidents/{first}"))["status"] != "open" and i,
            120,
            f"incident {first} still open",
        )
        self.dl.wait(lambda: self.live(job, t0, steps=2), 120, "the job did not step again")
        row.cause, row.level, row.recovery_s = inc["cause"], inc["level"], inc.get("recovery_s")
        row.extra_incidents = len([i for i in self.incidents(job) if i["id"] not in seen]) - 1
        row.status = "ok" if inc["status"] == "resolved" else inc["status"]
        row.note = "" if row.status == "ok" else str(inc.get("outcome", ""))[:80]
        first_end: dict[int, float] = {}
        for rank, _, start, end, a, it in self.steps(job, t0):
            if start >= t0 and (a, it) > gen:
                first_end[rank] = min(first_end.get(rank, end), end)
        if len(first_end) == self.nproc:
            row.script_s = round(max(first_end.values()) - t0, 2)

    def job_run(self, job: str, faults: tuple[str, ...]) -> list[Row]:
        launcher, workers = job.split("-")
        rows = [Row(job, f, launcher, launcher == "ft_launcher", workers) for f in faults]
        if workers == "warm" and self.pool_error:
            raise Skip(f"no warm pool ({self.pool_error})")
        served = self.pool_served()
        proc = self.launch(job, launcher, workers == "warm")
        try:
            for row in rows:
                try:
                    self.fault(job, row.fault, row, proc)
                except Skip as exc:
                    row.status, row.note = "failed", str(exc)
                    print(f"skip: {job} {row.fault}: {exc}", flush=True)
                    if proc.poll() is not None or self.dl.left() <= 0:
                        break
                else:
                    print(f"done: {_row_line(row)}", flush=True)
        finally:
            demojob.stop([proc], grace=10)
        for row in rows:
            if row.status == "skipped":
                row.note = "not run: the job run ended before it"
        if workers == "warm" and served is not None:
            # every generation's workers, warm when the pool served them (else they ran cold)
            now = self.pool_served()
            for row in rows:
                row.note = f"{row.note}; " if row.note else ""
                row.note += f"the pool served {(now or 0) - served} workers in this job run"
        return rows

    def pool_served(self) -> int | None:
        """Workers the agent's warm pool started so far (None: no pool answers)."""
        from trainguard.worker import pool_path_for
        from trainguard.worker.supervisor import query

        st = query(pool_path_for(self.socket))
        return int(st["served"]) if st is not None else None

    # --- the agent's readings -------------------------------------------------------------

    def readings(self, since: float) -> dict[str, Any]:
        """The node's GPUs and the ranges of their samples since `since`, from the API."""
        gpus = self.get(f"/nodes/{NODE}/gpus")
        out: dict[str, Any] = {
            "node": NODE,
            "agent": self.agent_line,
            "note": self.agent_note,
            "count": len(gpus),
            "names": sorted({g["name"] for g in gpus}),
            "simulated": sorted({g["simulated"] for g in gpus}),
        }
        cols = ("util", "mem_used_mib", "temp_c", "power_w")
        vals: dict[str, list[float]] = {c: [] for c in cols}
        samples = 0
        for g in gpus:
            s = self.get(f"/gpus/{g['uuid']}/samples", since=since, until=time.time(), points=5000)
            samples += len(s["columns"]["ts"])
            for c in cols:
                vals[c] += [v for v in s["columns"][c] if v is not None]
        out["samples"] = samples
        out["ranges"] = {c: (min(v), max(v)) if v else None for c, v in vals.items()}
        return out


def _stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "(no output)"


def _row_line(r: Row) -> str:
    rec = f"{r.recovery_s:.2f} s" if r.recovery_s is not None else "-"
    view = f"{r.script_s:.2f} s" if r.script_s is not None else "-"
    return f"{r.job} {r.fault}: {r.status}, {r.cause} -> {r.level}, recovery {rec} (script {view})"


def run(
    *,
    cpu: bool = False,
    jobs: tuple[str, ...] = JOBS,
    faults: tuple[str, ...] = FAULTS,
    nproc: int = 0,
    timeout_s: float = 330.0,
    workdir: str | None = None,
) -> dict[str, Any]:
    """The check; never raises for a missing piece (see the module docstring)."""
    dl = Deadline(timeout_s)
    t_start = time.time()
    pr = probe()
    if nproc <= 0:
        nproc = 2 if cpu else max(1, min(2, len(pr.devices)))
    result: dict[str, Any] = {
        "mode": "cpu (gloo, simulated GPUs)" if cpu else "gpu (NCCL, NVML)",
        "probe": asdict(pr),
        "nproc": nproc,
        "rows": [],
        "readings": None,
        "skipped": [],
    }
    print(
        f"gpucheck: python {pr.python}, torch {pr.torch or '-'}, CUDA devices "
        f"{len(pr.devices)} {pr.devices[:1]}, NCCL {pr.nccl or '-'}, NVRx {pr.nvrx or '-'}; "
        f"{result['mode']}, {nproc} rank(s) per job",
        flush=True,
    )
    runnable = []
    for job in jobs:
        reason = why_not(job, pr, cpu)
        if reason:
            for f in faults:
                print(f"skip: {job} {f}: {reason}", flush=True)
                result["rows"].append(asdict(Row(job, f, *_kind(job), note=reason)))
        else:
            runnable.append(job)
    with tempfile.TemporaryDirectory(prefix="tg-gpucheck-") as tmp:
        work = Path(workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        try:
            check = Check(
                work, cpu=cpu, nproc=nproc, pool=any(j.endswith("warm") for j in runnable), dl=dl
            )
        except Exception as exc:  # no server or no agent: nothing below can run
            reason = f"no server or agent ({type(exc).__name__}: {str(exc)[:160]})"
            print(f"skip: every cell: {reason}", flush=True)
            result["skipped"].append(reason)
            for job in runnable:
                for f in faults:
                    result["rows"].append(asdict(Row(job, f, *_kind(job), note=reason)))
            return result
        try:
            for job in runnable:
                if dl.left() <= 5:
                    rows = [Row(job, f, *_kind(job), note="out of time") for f in faults]
                    for r in rows:
                        print(f"skip: {job} {r.fault}: out of time", flush=True)
                else:
                    try:
                        rows = check.job_run(job, faults)
                    except Skip as exc:
                        print(f"skip: {job}: {exc}", flush=True)
                        rows = [Row(job, f, *_kind(job), note=str(exc)) for f in faults]
                result["rows"] += [asdict(r) for r in rows]
            try:
                result["readings"] = check.readings(t_start)
            except Exception as exc:
                result["skipped"].append(f"readings: {type(exc).__name__}: {exc}")
                print(f"skip: readings: {type(exc).__name__}: {exc}", flush=True)
        finally:
            check.close()
    order = {j: i for i, j in enumerate(jobs)}
    result["rows"].sort(key=lambda r: (order[r["job"]], faults.index(r["fault"])))
    result["wall_s"] = round(time.time() - t_start, 1)
    return result


def _kind(job: str) -> tuple[str, bool, str]:
    launcher, workers = job.split("-")
    return launcher, launcher == "ft_launcher", workers


def _fmt(v: float | None) -> str:
    return f"{v:.2f}" if v is not None else "-"


def _span(r: tuple[float, float] | None, scale: float = 1.0, digits: int = 0) -> str:
    if r is None:
        return "-"
    return f"{r[0] / scale:.{digits}f}-{r[1] / scale:.{digits}f}"


def table(result: dict[str, Any]) -> str:
    rows = [
        "| launcher | Wrapper | workers | fault | cause -> level | recovery_s (trainguard) "
        "| fault -> next step (script) | status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        level = f"{r['cause']} -> {r['level']}" if r["level"] else "-"
        status = r["status"] + (f": {r['note']}" if r["note"] else "")
        rows.append(
            f"| {r['launcher']} | {'yes' if r['wrapper'] else 'no'} | {r['workers']} "
            f"| {r['fault']} | {level} | {_fmt(r['recovery_s'])} | {_fmt(r['script_s'])} "
            f"| {status} |"
        )
    rd = result.get("readings")
    if rd:
        rg = rd["ranges"]
        rows += [
            "",
            f"agent readings ({rd['node']}, {rd['samples']} samples): {rd['count']} x "
            f"{', '.join(rd['names']) or '-'}; simulated: "
            f"{', '.join(str(s).lower() for s in rd['simulated']) or '-'}; utilization "
            f"{_span(rg['util'])} %, memory used {_span(rg['mem_used_mib'], 1024, 1)} GiB, "
            f"temperature {_span(rg['temp_c'])} C, power {_span(rg['power_w'])} W",
        ]
        if rd["agent"]:
            rows.append(f"agent: {rd['agent']}")
        if rd["note"]:
            rows.append(f"note: {rd['note']}")
    pr = result["probe"]
    rows.append(
        f"{result['mode']}: python {pr['python']}, torch {pr['torch'] or '-'}, "
        f"{len(pr['devices'])} CUDA device(s), NCCL {pr['nccl'] or '-'}, NVRx "
        f"{pr['nvrx'] or '-'}; {result['nproc']} rank(s) per job; wall "
        f"{result.get('wall_s', '-')} s"
    )
    return "\n".join(rows)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="gloo and `--simulate 2`, for testing")
    p.add_argument("--jobs", default=",".join(JOBS), help=f"of {','.join(JOBS)}")
    p.add_argument("--faults", default=",".join(FAULTS), help=f"of {','.join(FAULTS)}")
    p.add_argument("--nproc", type=int, default=0, help="ranks per job (0: GPUs, at most 2)")
    p.add_argument("--timeout", type=float, default=330.0, help="seconds for the whole check")
    p.add_argument("--json", default=None, help="write the result here")
    p.add_argument("--workdir", default=None, help="keep the logs here")
    a = p.parse_args(argv)
    # `timeout` (deploy/gpu-check.sh) ends the check with SIGTERM: unwind, so that the
    # server, the agent and the launchers it started are stopped on the way out.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    jobs = tuple(j for j in a.jobs.split(",") if j)
    faults = tuple(f for f in a.faults.split(",") if f)
    bad = [j for j in jobs if j not in JOBS] + [f for f in faults if f not in FAULTS]
    if bad or not jobs or not faults:
        print(
            f"gpucheck: --jobs takes {','.join(JOBS)}, --faults {','.join(FAULTS)}", file=sys.stderr
        )
        return 2
    res = run(
        cpu=a.cpu, jobs=jobs, faults=faults, nproc=a.nproc, timeout_s=a.timeout, workdir=a.workdir
    )
    print(table(res), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    ran = [r for r in res["rows"] if r["status"] == "ok"]
    return 0 if ran else 1


if __name__ == "__main__":
    sys.exit(main())
