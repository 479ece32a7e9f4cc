"""The agent's command executor: takes commands for its node and carries them out.

`CommandLoop(agent, local=LocalServer)` is an agent component. It long-polls
`GET /api/v1/agents/{node}/commands?wait=20` (so a command reaches the node within a
fraction of a second), runs each command once (ids are remembered in the spool directory,
so an agent restart does not run a command twice) and acks every phase with the time it
was observed, via `POST /api/v1/commands/{id}/acks`:

- delivered: at once, before anything else;
- in_process: the restart request goes to the job's ranks through the SDK channel;
  torn_down = a rank raised RestartRequested, restarted = every local rank reported a new
  Wrapper iteration, resumed = every local rank completed a step in that iteration;
- launcher: SIGTERM to the job's worker processes on this node (never their launcher),
  SIGKILL after `grace_s`; torn_down = all gone, restarted = the launcher's new workers
  registered, resumed = each of them completed a step.
- exclude_node / stop_job are not carried out by this executor (cordon hooks are the
  backend's); they are acked `failed` with the reason.

A phase that does not happen within its timeout is acked `failed` with what was missing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import msgspec

from agent.local import LocalServer, proc_info
from agent.wire import Ack, Command

log = logging.getLogger(__name__)


def decode_commands(body: bytes, ack: Any = None) -> list[Command]:
    """The poll answer, one command at a time: a command that breaks the wire format must
    not block the ones behind it. A list in `params` (not a wire scalar) is joined into a
    comma-separated string; a command still invalid is acked `failed` (when it has an id)
    so the backend stops re-delivering it."""
    out: list[Command] = []
    for item in msgspec.json.decode(body):
        try:
            out.append(msgspec.convert(item, Command))
            continue
        except msgspec.ValidationError as exc:
            error = str(exc)
        if isinstance(item, dict) and isinstance(item.get("params"), dict):
            item = dict(item)
            item["params"] = {
                k: ",".join(map(str, v)) if isinstance(v, list) else v
                for k, v in item["params"].items()
            }
            try:
                out.append(msgspec.convert(item, Command))
                log.warning("command %s: non-scalar params flattened (%s)", item.get("id"), error)
                continue
            except msgspec.ValidationError as exc:
                error = str(exc)
        log.error("undecodable command %r: %s", item, error)
        cid, node = (item.get("id"), item.get("node")) if isinstance(item, dict) else (None, None)
        if ack is not None and isinstance(cid, str) and isinstance(node, str):
            with contextlib.suppress(Exception):
                ack(cid, Ack(phase="failed", ts=time.time(), node=node, detail=error[:256]))
    return out


class CommandTransport(Protocol):
    def poll(self, node: str, wait: float) -> list[Command]: ...

    def ack(self, command_id: str, ack: Ack) -> None: ...


class HttpTransport:
    """The backend's command endpoints over httpx, with the agent's bearer token."""

    def __init__(self, server: str, token: str, timeout: float = 10.0) -> None:
        import httpx  # the agent extra

        self._client = httpx.Client(
            base_url=server.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"} if token else {},
            timeout=timeout,
        )

    def poll(self, node: str, wait: float) -> list[Command]:
        r = self._client.get(
            f"/api/v1/agents/{node}/commands",
            params={"wait": wait},
            timeout=wait + 10.0,
        )
        r.raise_for_status()
        return decode_commands(r.content, self.ack)

    def ack(self, command_id: str, ack: Ack) -> None:
        r = self._client.post(
            f"/api/v1/commands/{command_id}/acks",
            content=msgspec.json.encode(ack),
            headers={"Content-Type": "application/json"},
        )
        r.raise_for_status()

    def close(self) -> None:
        self._client.close()


class DoneLog:
    """Command ids already executed, one per line in <spool>/commands-done.log."""

    def __init__(self, directory: Path | None) -> None:
        self.path = directory / "commands-done.log" if directory else None
        self.ids: set[str] = set()
        self._lock = threading.Lock()
        if self.path and self.path.exists():
            self.ids = {line.strip() for line in self.path.read_text().splitlines() if line.strip()}

    def add(self, command_id: str) -> bool:
        """Remember an id; False when it was already there (do not run it again)."""
        clean = command_id.replace("\n", " ").strip()
        with self._lock:
            if clean in self.ids:
                return False
            self.ids.add(clean)
            if self.path:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a") as f:
                    f.write(clean + "\n")
                    f.flush()
                    os.fsync(f.fileno())
            return True


class CommandLoop:
    def __init__(
        self,
        agent: Any,
        local: LocalServer,
        transport: CommandTransport | None = None,
        node: str | None = None,
        spool_dir: str | Path | None = None,
        wait_s: float = 20.0,
        grace_s: float = 5.0,
        torn_down_timeout_s: float = 60.0,
        restarted_timeout_s: float = 180.0,
        resumed_timeout_s: float = 180.0,
    ) -> None:
        cfg = getattr(agent, "config", None)
        self.agent = agent
        self.local = local
        self.node = node or getattr(cfg, "node", None) or socket.gethostname()
        if transport is None:
            if cfg is None:
                raise ValueError("CommandLoop needs a transport or an agent with .config")
            transport = HttpTransport(str(cfg.server), str(getattr(cfg, "token", "") or ""))
        self.transport = transport
        spool = spool_dir or getattr(cfg, "spool_dir", None)
        self.done = DoneLog(Path(spool) if spool else None)
        self.wait_s = wait_s
        self.grace_s = grace_s
        self.torn_down_timeout_s = torn_down_timeout_s
        self.restarted_timeout_s = restarted_timeout_s
        self.resumed_timeout_s = resumed_timeout_s
        self.acks: list[tuple[str, Ack]] = []  # what was acked, for logs and tests
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._workers: list[threading.Thread] = []

    # --- component life cycle -----------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="tg-commands", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        closer = getattr(self.transport, "close", None)
        if closer is not None:
            with contextlib.suppress(Exception):
                closer()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                commands = self.transport.poll(self.node, self.wait_s)
                backoff = 0.5
            except Exception as exc:
                if self._stop.is_set():
                    return
                log.warning("command poll failed: %s (retry in %.1f s)", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 15.0)
                continue
            for cmd in commands:
                self.handle(cmd)

    # --- one command ------------------------------------------------------------------

    def handle(self, cmd: Command) -> threading.Thread | None:
        """Ack delivery at once; run the command in its own thread unless it already ran."""
        first_time = self.done.add(cmd.id)
        self._ack(cmd.id, "delivered", time.time(), "" if first_time else "already executed")
        if not first_time:
            return None
        t = threading.Thread(
            target=self._execute, args=(cmd,), name=f"tg-cmd-{cmd.id}", daemon=True
        )
        self._workers.append(t)
        t.start()
        return t

    def _ack(self, command_id: str, phase: str, ts: float, detail: str = "") -> None:
        ack = Ack(phase=phase, ts=ts, node=self.node, detail=detail[:256])  # type: ignore[arg-type]
        self.acks.append((command_id, ack))
        delay = 0.2
        for _ in range(6):
            try:
                self.transport.ack(command_id, ack)
                return
            except Exception as exc:
                log.warning("ack %s %s failed: %s", command_id, phase, exc)
                if self._stop.wait(delay):
                    return
                delay *= 2

    def _execute(self, cmd: Command) -> None:
        try:
            if cmd.action == "in_process":
                self._in_process(cmd)
            elif cmd.action == "launcher":
                self._launcher(cmd)
            else:
                self._ack(
                    cmd.id,
                    "failed",
                    time.time(),
                    f"{cmd.action} is carried out by the backend's cordon hook, not the agent",
                )
        except Exception as exc:  # a command must always end in an ack
            log.exception("command %s failed", cmd.id)
            self._ack(cmd.id, "failed", time.time(), f"{type(exc).__name__}: {exc}")

    def _param(self, cmd: Command, name: str, default: float) -> float:
        value = cmd.params.get(name)
        return float(value) if isinstance(value, int | float) else default

    def _in_process(self, cmd: Command) -> None:
        local, job = self.local, cmd.job
        with local.cond:
            before = {r.pid: r.iteration for r in local.job_ranks(job)}
            served = self._already_restarted(cmd)
        if not before:
            self._ack(cmd.id, "failed", time.time(), f"no live rank of job {job} on this node")
            return
        if served is not None:
            # NVRx's Wrapper restarts on an exception by itself: when every rank is already
            # past the fault's generation, a second restart would only cost time.
            self._report_served(cmd, served)
            return
        local.request_restart(job, cmd.id, cmd.reason or "in_process restart requested")

        def torn_down() -> float | None:
            stamps = [
                r.restart_raised[cmd.id]
                for r in local.job_ranks(job, alive_only=False)
                if cmd.id in r.restart_raised
            ]
            moved = [
                r
                for r in local.job_ranks(job, alive_only=False)
                if r.pid in before and r.iteration != before[r.pid]
            ]
            if stamps:
                return min(stamps)
            return time.time() if moved else None

        ts = local.wait_until(torn_down, self.torn_down_timeout_s)
        if ts is None:
            self._ack(cmd.id, "failed", time.time(), "no rank raised the restart request")
            return
        self._ack(cmd.id, "torn_down", ts)

        def restarted() -> float | None:
            recs = [r for r in local.job_ranks(job, alive_only=False) if r.pid in before]
            if any(not r.alive for r in recs):
                return -1.0  # a rank died: the launcher takes over
            if all(r.iteration != before[r.pid] for r in recs):
                return max(r.iteration_started_at for r in recs)
            return None

        ts = local.wait_until(restarted, self.restarted_timeout_s)
        if ts is None or ts < 0:
            self._ack(
                cmd.id,
                "failed",
                time.time(),
                "a rank exited during the restart" if ts else "ranks did not re-enter",
            )
            return
        self._ack(cmd.id, "restarted", ts)

        self._ack_resumed(cmd, set(before))

    def _ack_resumed(self, cmd: Command, pids: set[int], detail: str = "") -> None:
        """Ack `resumed` at the first completed step of every one of these ranks in its
        new generation, or `failed` if that does not come in time."""
        local, job = self.local, cmd.job

        def resumed() -> float | None:
            recs = [r for r in local.job_ranks(job) if r.pid in pids]
            ends = [r.first_step_end_this_iteration for r in recs]
            if recs and all(e is not None for e in ends):
                return max(e for e in ends if e is not None)
            return None

        ts = local.wait_until(resumed, self.resumed_timeout_s)
        if ts is None:
            self._ack(cmd.id, "failed", time.time(), "no step completed after the restart")
            return
        self._ack(cmd.id, "resumed", ts, detail)

    def _already_restarted(self, cmd: Command) -> list[Any] | None:
        """The job's ranks here if all of them are in a later generation (attempt,
        iteration) than the fault's (the command's params), else None."""
        it, att = cmd.params.get("iteration"), cmd.params.get("attempt")
        if not isinstance(it, int) or isinstance(it, bool):
            return None
        fault = (att if isinstance(att, int) and not isinstance(att, bool) else 0, it)
        recs = self.local.job_ranks(cmd.job)
        if recs and all((r.attempt, r.iteration) > fault for r in recs):
            return list(recs)
        return None

    def _report_served(self, cmd: Command, recs: list[Any]) -> None:
        """Ack the phases of the restart that already happened, with its own times."""
        detail = f"already restarted in process (iteration {max(r.iteration for r in recs)})"
        started = [r.iteration_started_at for r in recs]
        self._ack(cmd.id, "torn_down", min(started), detail)
        self._ack(cmd.id, "restarted", max(started), detail)
        self._ack_resumed(cmd, {r.pid for r in recs}, detail)

    def _launcher(self, cmd: Command) -> None:
        local, job = self.local, cmd.job
        grace = self._param(cmd, "grace_s", self.grace_s)
        with local.cond:
            recs = local.job_ranks(job)
            launchers = {r.ppid for r in recs}
            victims = {
                r.pid: r.start_ticks
                for r in recs
                if r.pid not in launchers and r.pid != os.getpid()
            }
        if not victims:
            self._ack(cmd.id, "failed", time.time(), f"no live rank of job {job} on this node")
            return
        self._signal_all(victims, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not self._all_gone(victims):
            time.sleep(0.05)
        if not self._all_gone(victims):
            self._signal_all(victims, signal.SIGKILL)
            deadline = time.monotonic() + self.torn_down_timeout_s
            while time.monotonic() < deadline and not self._all_gone(victims):
                time.sleep(0.05)
        if not self._all_gone(victims):
            self._ack(cmd.id, "failed", time.time(), "worker processes did not end")
            return
        self._ack(cmd.id, "torn_down", time.time(), f"ended {len(victims)} worker(s)")

        def new_ranks() -> list[Any] | None:
            fresh = [r for r in local.job_ranks(job) if r.pid not in victims]
            return fresh if len(fresh) >= len(victims) else None

        fresh = local.wait_until(new_ranks, self.restarted_timeout_s)
        if fresh is None:
            self._ack(cmd.id, "failed", time.time(), "the launcher did not start new workers")
            return
        self._ack(cmd.id, "restarted", max(r.registered_at for r in fresh))
        pids = {r.pid for r in fresh}

        self._ack_resumed(cmd, pids)

    @staticmethod
    def _alive(pid: int, start_ticks: int) -> bool:
        info = proc_info(pid)
        if info is None or info.state in ("Z", "X"):
            return False
        return not start_ticks or info.start_ticks == start_ticks

    def _all_gone(self, victims: dict[int, int]) -> bool:
        return not any(self._alive(pid, st) for pid, st in victims.items())

    def _signal_all(self, victims: dict[int, int], sig: int) -> None:
        for pid, st in victims.items():
            if self._alive(pid, st):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
