"""The recovery bench with trainguard's decisions in the loop (`backend/bench/recovery.py`).

A real `trainguard server` (SQLite in the run's work directory, its decision engine on)
and the two imitated nodes' agents posting to it over HTTP, each with the command executor
(`agent/executors/loop.py`) long-polling for its node's commands. The engine chooses the restart
level for every fault from the evidence the agents send; this module starts that backend,
connects the agents, and reads back from the incidents which level the engine chose and
who carried the restart out.

Who reacted is stated per fault, because NVRx also reacts by itself:

- an in_process command whose ranks raised the request (`restart` event, phase `raised`,
  with the command's id) is the engine's restart;
- an in_process command acked with "already restarted" found the ranks restarted by NVRx's
  Wrapper before it arrived (the executor acks that restart's own times);
- a launcher command after a rank's death (`rank_exit` evidence before the command): the
  dead rank's ft_launcher restarts the worker group by itself; the command ends the
  workers still alive on each node (the executor's SIGTERM races the launcher's own);
- a launcher command without a death before it is the engine's restart (its SIGTERM ended
  the workers, the launchers respawned them).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from trainguard.agent.uplink.outbox import Drained, Outbox

# The engine's policy for this bench: backend/policy/default.toml with two keys changed.
# The demo compresses 5 faults into about a minute of job time; the default cooldown (10 s
# between two actions on a job) and ladder (3 in-process actions within 30 min make the
# next fault a launcher restart) are sized for faults hours apart and would turn the run
# into a measurement of the cooldown and of the ladder. Pass the default file
# (`engine_policy=`) to measure those instead.
BENCH_POLICY = """\
# trainguard bench recovery: the default policy, sized for 5 faults in about a minute
[limits]
cooldown_s = 0
[escalation]
window_s = 1
"""


class TeeOutbox(Outbox):
    """An outbox that keeps a copy of everything the uplink drains (to the backend), so
    that the bench analyses exactly the records the backend received."""

    def __init__(self) -> None:
        super().__init__()
        self.sent_events: list[Any] = []
        self.sent_steps: list[Any] = []

    def drain(self, max_samples: int, max_events: int, max_steps: int) -> Drained:
        d = super().drain(max_samples, max_events, max_steps)
        self.sent_events.extend(d.events)
        self.sent_steps.extend(d.steps)
        return d


class ConnectedAgent:
    """One node's agent as `trainguard agent --simulate 2` runs it (uplink, SDK socket,
    command executor), in a thread of the bench process so its outbox can be read."""

    def __init__(self, cfg: Any) -> None:
        from trainguard.agent.collectors.simulated import SimulatedGpus
        from trainguard.agent.daemon import Agent
        from trainguard.agent.executors.loop import CommandLoop
        from trainguard.agent.ranks.server import LocalServer
        from trainguard.agent.uplink.spool import Spool

        self.outbox = TeeOutbox()
        source = SimulatedGpus(cfg.simulate, cfg.node, cfg.seed, self.outbox)
        self.agent = Agent(
            cfg, source, self.outbox, spool=Spool(cfg.spool_dir, cfg.spool_max_bytes)
        )
        self.local = LocalServer(self.agent)
        self.commands = CommandLoop(self.agent, self.local)
        self.agent.add_component(self.local)
        self.agent.add_component(self.commands)
        self._thread = threading.Thread(target=self.agent.run, name=f"agent-{cfg.node}")
        self._thread.start()
        deadline = time.monotonic() + 10
        while self.local.socket_path is None or not Path(self.local.socket_path).exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"agent {cfg.node}: SDK socket not up after 10 s")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the agent; its uplink sends what is left in the outbox first."""
        self.agent.stop()
        self._thread.join(30)


class Backend:
    """`trainguard server` on SQLite in `workdir`, with the bench's policy file."""

    def __init__(self, workdir: Path, policy: str | os.PathLike[str] | None = None) -> None:
        from trainguard.backend import demojob
        from trainguard.backend.demo import start_server

        workdir.mkdir(parents=True, exist_ok=True)
        if policy is None:
            policy = workdir / "policy.toml"
            Path(policy).write_text(BENCH_POLICY)
        self.policy = str(policy)
        self.token = secrets.token_urlsafe(24)
        self.port = demojob.free_port(8400, 8999)
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "TRAINGUARD_ADMIN_TOKEN": self.token,
            "TRAINGUARD_DATA_DIR": str(workdir / "data"),
            "TRAINGUARD_POLICY_FILE": self.policy,
        }
        env.pop("TRAINGUARD_DATABASE_URL", None)
        self._log = (workdir / "server.log").open("wb")
        self.proc: subprocess.Popen[bytes] = start_server(self.port, env, stdout=self._log)

    def get(self, path: str, **params: Any) -> Any:
        import httpx

        r = httpx.get(
            f"{self.url}{path}",
            params=params,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        )
        r.raise_for_status()
        return r.json()

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """POST `body` as JSON; (status code, the answer's JSON, or its text)."""
        import httpx

        r = httpx.post(
            f"{self.url}{path}",
            json=body,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        )
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, r.text

    def incidents(self, job: str) -> list[dict[str, Any]]:
        return sorted(self.get("/api/v1/incidents", job=job, limit=1000), key=lambda i: i["id"])

    def settle(self, job: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """The job's incidents once none is open any more (or after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            incs = self.incidents(job)
            if all(i["status"] != "open" for i in incs) or time.monotonic() > deadline:
                return incs
            time.sleep(0.5)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def _match(fired: list[tuple[float, int, int, int]], fault_at: float | None) -> int | None:
    """The index of the fault an incident belongs to: the last one injected at or before
    its first evidence (the SDK logs a fault just before it fires; 50 ms of slack for the
    log's own timestamp)."""
    if fault_at is None:
        return None
    best = None
    for ts, index, _rank, _step in fired:
        if ts <= fault_at + 0.05:
            best = index
    return best


def who_reacted(incident: dict[str, Any], raised: set[str]) -> str:
    """Which restart carried the incident out: the engine's command or NVRx's own reaction
    (see the module docstring). `raised` = the command ids some rank raised."""
    cmds = incident.get("commands") or []
    if not cmds:
        return "no command"
    final = cmds[-1]["action"]
    current = [c for c in cmds if c["action"] == final]
    details = [a.get("detail") or "" for c in current for a in c["acks"]]
    ended = [
        f"{a['detail']} on {c['node']}"
        for c in current
        for a in c["acks"]
        if (a.get("detail") or "").startswith("ended ")
    ]
    failed = [a for c in current for a in c["acks"] if a["phase"] == "failed"]
    if final == "in_process":
        if any(c["id"] in raised for c in current):
            return "engine: its in_process request was raised in the ranks"
        if any(d.startswith("already restarted") for d in details):
            return "NVRx Wrapper by itself (the command found the ranks restarted)"
        if failed:
            return f"in_process command failed: {failed[0].get('detail')}"
        return "NVRx Wrapper (the ranks restarted before the request was raised)"
    if final == "launcher":
        first_cmd = min(c["issued_at"] for c in current)
        died = any(
            e["kind"] == "rank_exit" and e["ts"] <= first_cmd
            for e in incident.get("evidence") or []
        )
        tail = f"; its SIGTERM {', '.join(ended)}" if ended else ""
        if died:
            return f"ft_launcher by itself after the rank's death{tail}"
        return f"engine: its launcher command ended the workers{tail}"
    return f"{final} (not carried out by the agents)"


def decisions_per_fault(
    fired: list[tuple[float, int, int, int]],
    kinds: dict[int, str],
    incidents: list[dict[str, Any]],
    raised: set[str],
) -> dict[str, Any]:
    """For each fired fault (ts, index, rank, step) its incident(s): the levels the engine
    chose in order, who carried the restart out, and the timeline relative to the fault;
    incidents that match no fault are returned apart."""
    rows: dict[int, dict[str, Any]] = {
        index: {
            "index": index,
            "kind": kinds.get(index),
            "rank": rank,
            "step": step,
            "fault_ts": ts,
            "incidents": [],
        }
        for ts, index, rank, step in fired
    }
    unmatched = []
    for inc in sorted(incidents, key=lambda i: i["timeline"].get("fault_at") or 0.0):
        tl = inc["timeline"]
        index = _match(fired, tl.get("fault_at"))
        if index is None:
            unmatched.append({"id": inc["id"], "cause": inc["cause"], "level": inc["level"]})
            continue
        t = rows[index]["fault_ts"]

        def rel(key: str, base: float | None, tl: dict[str, Any] = tl) -> float | None:
            v = tl.get(key)
            return round(v - base, 3) if v is not None and base is not None else None

        rows[index]["incidents"].append(
            {
                "id": inc["id"],
                "cause": inc["cause"],
                "levels": [d["level"] for d in inc.get("decisions") or []],
                "level": inc["level"],
                "status": inc["status"],
                "outcome": inc.get("outcome"),
                "escalations": inc.get("escalations"),
                "evidence": [e["kind"] for e in inc.get("evidence") or []],
                "who": who_reacted(inc, raised),
                # seconds from the fault (the SDK's injection log) ...
                "detected_s": rel("detected_at", t),
                "decided_s": rel("decided_at", t),
                "delivered_s": rel("delivered_at", t),
                "torn_down_s": rel("torn_down_at", t),
                "restarted_s": rel("restarted_at", t),
                "resumed_s": rel("resumed_at", t),
                # ... and the engine's own legs: evidence received -> decided -> delivered
                "decide_ms": _ms(tl.get("decided_at"), tl.get("detected_at")),
                "deliver_ms": _ms(tl.get("delivered_at"), tl.get("decided_at")),
            }
        )
    return {"faults": [rows[i] for i in sorted(rows)], "unmatched_incidents": unmatched}


def _ms(a: float | None, b: float | None) -> float | None:
    return round((a - b) * 1000, 1) if a is not None and b is not None else None


def raised_requests(events: list[Any]) -> set[str]:
    """Command ids that some rank raised (the agents' `restart` events, phase `raised`)."""
    return {
        str(e.data.get("request"))
        for e in events
        if e.kind == "restart" and e.data.get("phase") == "raised"
    }


def decisions_table(report: dict[str, Any]) -> str:
    rows = [
        "| fault (kind, rank, step) | engine chose | carried out by | evidence -> decided -> "
        "delivered (ms) | fault -> detected / delivered / resumed (s) |",
        "|---|---|---|---|---|",
    ]
    for f in report["faults"]:
        head = f"{f['index']} ({f['kind']}, rank {f['rank']}, step {f['step']})"
        if not f["incidents"]:
            rows.append(f"| {head} | no incident | - | - | - |")
        for inc in f["incidents"]:
            rows.append(
                f"| {head} | {' -> '.join(inc['levels']) or '-'} ({inc['status']}) "
                f"| {inc['who']} | {inc['decide_ms']} -> {inc['deliver_ms']} "
                f"| {inc['detected_s']} / {inc['delivered_s']} / {inc['resumed_s']} |"
            )
    for u in report["unmatched_incidents"]:
        rows.append(f"| no fault (incident {u['id']}: {u['cause']}) | {u['level']} | - | - | - |")
    return "\n".join(rows)
