"""Synthetic agent batches for the dashboard's tests and benchmark: what real agents
would send for a training job (StepReport + RankStatus) or for a large cluster (GPU
inventory + one sample per GPU), as plain JSON bodies for POST /api/v1/ingest.

Everything is derived from a seed, so a run draws the same cluster every time."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from typing import Any


def agent_id() -> str:
    return uuid.uuid4().hex[:16]


@dataclass
class JobSeed:
    """A job of `len(nodes) * ranks_per_node` ranks, `steps` steps of about `step_s`
    seconds each, ending now; `slow_rank` runs `slow_factor` times slower. `in_process`
    and `launcher` are what its ranks declare through the SDK (None: nothing, as an older
    SDK); a test may change them while a feed runs."""

    name: str
    nodes: list[str]
    ranks_per_node: int = 4
    steps: int = 60
    step_s: float = 1.0
    slow_rank: int | None = 5
    slow_factor: float = 1.6
    attempt: int = 0
    iteration: int = 0
    seed: int = 7
    in_process: bool | None = None
    launcher: str | None = None
    display_name: str | None = None
    max_restarts: int | None = None  # the launcher's restart budget, as the SDK declares it
    restart_count: int | None = None
    timeouts: dict[str, Any] | None = None  # wire.Timeouts' fields, as the agent reports them
    _agents: dict[str, str] = field(default_factory=dict)
    _seq: dict[str, int] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return len(self.nodes) * self.ranks_per_node

    def batches(
        self, now: float, first_step: int = 0, steps: int | None = None
    ) -> list[dict[str, Any]]:
        """One batch per node with its ranks' steps [first_step, first_step + steps),
        the last one ending about now, and every rank's status."""
        count = self.steps if steps is None else steps
        rng = random.Random(self.seed + first_step)
        t0 = now - count * self.step_s * 1.05
        out = []
        for n, node in enumerate(self.nodes):
            ranks = range(n * self.ranks_per_node, (n + 1) * self.ranks_per_node)
            steps = []
            for rank in ranks:
                t = t0
                for i in range(count):
                    slow = self.slow_factor if rank == self.slow_rank else 1.0
                    dt = self.step_s * slow * rng.uniform(0.92, 1.08)
                    # Every rank waits for the slowest at the step's end (synchronous SGD):
                    # the straggler's own compute is what shows in its step time.
                    steps.append(
                        {
                            "job": self.name,
                            "rank": rank,
                            "step": first_step + i,
                            "start": t,
                            "end": t + dt,
                            "attempt": self.attempt,
                            "iteration": self.iteration,
                        }
                    )
                    t += self.step_s * 1.05
            status = [
                {
                    "job": self.name,
                    "rank": rank,
                    "pid": 40000 + rank,
                    "local_rank": rank - n * self.ranks_per_node,
                    "world_size": self.world_size,
                    "attempt": self.attempt,
                    "iteration": self.iteration,
                    "last_heartbeat": now,
                    "last_step": first_step + count - 1,
                    "alive": True,
                    **self._declared(),
                }
                for rank in ranks
            ]
            out.append({**self._envelope(node, now), "steps": steps, "ranks": status})
        return out

    def _envelope(self, node: str, now: float) -> dict[str, Any]:
        """A batch's header from `node`'s agent: its id and next sequence number."""
        self._seq[node] = self._seq.get(node, 0) + 1
        return {
            "node": node,
            "agent_id": self._agents.setdefault(node, agent_id()),
            "seq": self._seq[node],
            "sent_at": now,
            "simulated": True,
        }

    def _declared(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.in_process is not None:
            out["in_process"] = self.in_process
        if self.launcher is not None:
            out["launcher"] = self.launcher
        if self.display_name is not None:
            out["display_name"] = self.display_name
        if self.max_restarts is not None:
            out["max_restarts"] = self.max_restarts
        if self.restart_count is not None:
            out["restart_count"] = self.restart_count
        if self.timeouts is not None:
            out["timeouts"] = dict(self.timeouts)
        return out

    def exit_batches(self, now: float, exit_code: int = 0) -> list[dict[str, Any]]:
        """What the agents send when every rank of the job has exited with `exit_code`:
        each rank's `rank_exit` event and its status, no longer alive."""
        out = []
        for n, node in enumerate(self.nodes):
            ranks = range(n * self.ranks_per_node, (n + 1) * self.ranks_per_node)
            out.append(
                {
                    **self._envelope(node, now),
                    "events": [
                        {
                            "kind": "rank_exit",
                            "ts": now,
                            "job": self.name,
                            "rank": rank,
                            "data": {"exit_code": exit_code},
                        }
                        for rank in ranks
                    ],
                    "ranks": [
                        {
                            "job": self.name,
                            "rank": rank,
                            "pid": 40000 + rank,
                            "local_rank": rank - n * self.ranks_per_node,
                            "world_size": self.world_size,
                            "attempt": self.attempt,
                            "iteration": self.iteration,
                            "last_heartbeat": now,
                            "alive": False,
                            **self._declared(),
                        }
                        for rank in ranks
                    ],
                }
            )
        return out


def xid_batch(
    node: str, xid: int, now: float, message: str = "", gpu: str | None = None
) -> dict[str, Any]:
    gpu = gpu or f"GPU-{node}-0"
    return {
        "node": node,
        "agent_id": agent_id(),
        "seq": 1,
        "sent_at": now,
        "simulated": True,
        "gpus": [{"uuid": gpu, "index": 0, "name": "test GPU"}],
        "events": [{"kind": "xid", "ts": now, "gpu_uuid": gpu, "xid": xid, "message": message}],
    }


def cluster_batches(
    nodes: int, gpus_per_node: int, now: float, seed: int = 11
) -> list[dict[str, Any]]:
    """One batch per node: its GPU inventory and one sample per GPU (a large cluster)."""
    rng = random.Random(seed)
    out = []
    for n in range(nodes):
        name = f"gpu-node-{n:04d}"
        gpus = [
            {
                "uuid": f"GPU-{n:04d}-{g}-{uuid.UUID(int=rng.getrandbits(128))}",
                "index": g,
                "name": "NVIDIA H100 80GB HBM3",
                "memory_total_mib": 81559.0,
                "power_limit_w": 700.0,
            }
            for g in range(gpus_per_node)
        ]
        samples = [
            {
                "uuid": g["uuid"],
                "ts": now,
                "util": round(rng.uniform(85, 100), 1),
                "temp_c": round(rng.uniform(40, 75), 1),
                "power_w": round(rng.uniform(400, 690), 1),
                "mem_used_mib": 70000.0,
                "mem_total_mib": 81559.0,
            }
            for g in gpus
        ]
        out.append(
            {
                "node": name,
                "agent_id": agent_id(),
                "seq": 1,
                "sent_at": now,
                "simulated": True,
                "gpus": gpus,
                "samples": samples,
            }
        )
    return out
