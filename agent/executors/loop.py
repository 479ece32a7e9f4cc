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
- stop_job: SIGTERM to the job's launcher on this node, as its user would stop it (the
  launcher passes it to its workers and exits); torn_down = every launcher of the job
  here is gone. `failed` when its ranks have no launcher the agent may signal, or one
  outlives `stop_timeout_s`: the launcher then still restarts the job by itself.
- exclude_node: this node leaves the job (the backend cordoned it): SIGTERM to the job's
  launcher here, SIGKILL to it and its workers after `grace_s`; torn_down = everything
  of the job here is gone. A launcher ended by a signal leaves the rendezvous open, so
  the other nodes re-form without this one (on a spare, or fewer where elastic).

When the job's workers here are already gone, or die during an in_process restart (also
after re-entering, before their first step), while their launcher lives (ft_launcher
restarting its worker group after a rank death), the command follows that restart
instead of failing: it waits for the launcher's new workers and acks the phases not yet
acked (torn_down / restarted / resumed) with their times, noting that the launcher did
it. A command finding ranks already in a later generation than the fault's (the
command's attempt/iteration) acks that restart the same way and restarts nothing.

A phase that does not happen within its timeout is acked `failed` with what was missing.

The loop and the phases both levels share are here; the in_process level is
agent/executors/in_process.py, the launcher level (and following a launcher's own restart)
agent/executors/launcher.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import msgspec

from trainguard.agent.executors.in_process import InProcessRestart
from trainguard.agent.ranks.server import LocalServer
from trainguard.protocol.wire import Ack, Command, Phase

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


class RetryLater(Exception):
    """The backend asks to poll again after a while (503 or 429 with Retry-After: it is
    shutting down, or its database is unavailable): a retry, not a failure."""

    def __init__(self, after_s: float, reason: str) -> None:
        super().__init__(reason)
        self.after_s = after_s
        self.reason = reason


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
        if r.status_code in (429, 503):
            try:
                after = min(max(float(r.headers.get("Retry-After", 1)), 0.0), 60.0)
            except ValueError:  # an HTTP-date
                after = 1.0
            raise RetryLater(after, f"HTTP {r.status_code}: {_detail(r)}")
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


def _detail(r: Any) -> str:
    try:
        detail = r.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return " ".join(str(detail if detail is not None else r.text).split())[:200]


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


class CommandLoop(InProcessRestart):
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
        relaunch_grace_s: float = 5.0,
        stop_timeout_s: float = 60.0,
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
        # How long exited workers with no live launcher get for new ones to appear (with
        # a live launcher the wait is restarted_timeout_s, its restart window).
        self.relaunch_grace_s = relaunch_grace_s
        # How long a launcher gets to end its workers and exit after stop_job's SIGTERM
        # (torchrun waits 30 s for its workers before it kills them).
        self.stop_timeout_s = stop_timeout_s
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
        failing = ""  # the failure last logged: an outage is logged once, not every retry
        while not self._stop.is_set():
            try:
                commands = self.transport.poll(self.node, self.wait_s)
                backoff = 0.5
            except RetryLater as later:
                # Jitter on top: every agent of a stopping backend is told the same second.
                log.info("command poll: %s; again in %.0f s", later.reason, later.after_s)
                self._stop.wait(later.after_s + random.uniform(0, 1))
                continue
            except Exception as exc:
                if self._stop.is_set():
                    return
                if str(exc) != failing:
                    log.warning("command poll failed: %s (retry in %.1f s)", exc, backoff)
                    failing = str(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 15.0)
                continue
            if failing:
                log.info("command poll reaches the backend again")
                failing = ""
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

    def _ack(self, command_id: str, phase: Phase, ts: float, detail: str = "") -> None:
        ack = Ack(phase=phase, ts=ts, node=self.node, detail=detail[:256])
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
            # An agent that just started (restarted while its ranks trained) knows no rank
            # until they register again with their next heartbeat: a command judged now
            # would find "no live rank" of a job that trains here.
            self.local.wait_settled()
            if cmd.action == "in_process":
                self._in_process(cmd)
            elif cmd.action == "launcher":
                self._launcher(cmd)
            elif cmd.action == "stop_job":
                self._stop_job(cmd)
            else:  # exclude_node
                self._leave(cmd)
        except Exception as exc:  # a command must always end in an ack
            log.exception("command %s failed", cmd.id)
            self._ack(cmd.id, "failed", time.time(), f"{type(exc).__name__}: {exc}")

    # --- both restart levels ----------------------------------------------------------

    def _ack_resumed(self, cmd: Command, pids: set[int], detail: str = "") -> None:
        """Ack `resumed` at the first completed step of every one of these ranks in its
        new generation, or `failed` if that does not come in time. When all of them die
        first (a launcher ending the survivors of a rank that died before the command
        came), the launcher's restart is followed as in the `restarted` phase."""
        local, job = self.local, cmd.job

        def resumed() -> float | None:
            recs = [r for r in local.job_ranks(job) if r.pid in pids]
            if not recs:
                return -1.0  # every one of them died: the launcher takes over
            ends = [r.first_step_end_this_iteration for r in recs]
            if all(e is not None for e in ends):
                return max(e for e in ends if e is not None)
            return None

        ts = local.wait_until(resumed, self.resumed_timeout_s)
        if ts is not None and ts < 0:
            with local.cond:
                ranks = local.job_ranks(job, alive_only=False)
                latest = max((r.attempt for r in ranks if r.pid in pids), default=0)
                # Their generation (with a peer that died before the command came), not a
                # new one the launcher may have started already.
                known = [r for r in ranks if r.attempt == latest]
            self._follow_launcher(cmd, known, acked={"torn_down", "restarted"})
            return
        if ts is None:
            self._ack(cmd.id, "failed", time.time(), "no step completed after the restart")
            return
        self._ack(cmd.id, "resumed", ts, detail)

    def _already_restarted(self, cmd: Command, level: str) -> list[Any] | None:
        """The job's ranks here if all of them are in a later generation than the
        fault's (the command's params) and started after it, else None. A generation is
        (attempt, iteration) for an in_process command; a launcher restart makes new
        processes, so for a launcher command only a later attempt counts."""
        fault = cmd.typed_params()
        it, att = fault.iteration, fault.attempt
        recs = self.local.job_ranks(cmd.job)
        if not recs:
            return None
        if fault.fault_at is not None and not all(
            r.iteration_started_at > fault.fault_at for r in recs
        ):
            # Ranks that started before the fault are not its restart, whatever their
            # numbers: the attempts of two nodes' launchers are not comparable (torchrun
            # counts a restart on the failed node only; a spare that joined starts at 0).
            return None
        if level == "launcher":
            if att is None or not all(r.attempt > att for r in recs):
                return None
        elif it is None or not all((r.attempt, r.iteration) > (att or 0, it) for r in recs):
            return None
        return list(recs)

    def _report_served(self, cmd: Command, recs: list[Any]) -> None:
        """Ack the phases of the restart that already happened, with its own times."""
        att = cmd.typed_params().attempt
        if att is not None and all(r.attempt > att for r in recs):
            detail = f"already restarted by the launcher (attempt {max(r.attempt for r in recs)})"
        else:
            detail = f"already restarted in process (iteration {max(r.iteration for r in recs)})"
        started = [r.iteration_started_at for r in recs]
        self._ack(cmd.id, "torn_down", min(started), detail)
        self._ack(cmd.id, "restarted", max(started), detail)
        self._ack_resumed(cmd, {r.pid for r in recs}, detail)
