"""An exclusion takes the node out of a running job and a hot spare takes its place, with
real launchers (tests/restarts/matrix.py): a `trainguard server`, three `trainguard
agent`s imitating three nodes, and torchrun with `--nnodes 2`: two launchers train, and a
third started once they do waits as a spare (torch's rendezvous keeps a launcher beyond
MAX nodes in its redundancy list and lets it into the next round when a node is gone).

XID 79 on a rank of the second node: the engine cordons that node and its agent ends the
job's launcher there; the first node's workers get a launcher restart; the rendezvous
re-forms with the spare, and training resumes from the last checkpoint on the first node
and the spare. The first node's launcher hosts the c10d rendezvous store (`is_host`), so
the fault goes to the second node (docs/engine.md, "A node leaves the job", says why).
The job's shape says so on `GET /jobs/{job}`: before, nodes 0 and 1 train and node 2
waits as a spare (its agent lists its launcher: the job has no rank there); after, nodes 0
and 2 train and node 1 is excluded by the incident. Readmitted, node 1 gets a launcher
again and waits as the job's new spare.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import wait_for
from trainguard.backend import demojob

from .matrix import INJECT, PER_NODE, TORCHRUN, Cell, Stack

pytestmark = pytest.mark.slow


class SpareStack(Stack):
    """Three agents; launchers for the first two nodes at start, the spare's on demand."""

    ACTIVE = 2

    def __init__(self, tmp: Path, launcher: str) -> None:
        super().__init__(tmp, Cell(launcher, wrapper=False, nodes=3))
        self.rdzv = demojob.free_port()

    def launch(self) -> None:
        for i in range(3):
            wait_for(lambda i=i: self.agent_socket(i).exists(), 60, 0.1)  # type: ignore[union-attr]  # three nodes: a socket each
        for i in range(self.ACTIVE):
            self.launch_node(i)

    def launch_node(self, i: int) -> None:
        extra = {
            "TRAINGUARD_TEST_FAULTS": str(self.faults),
            "OMP_NUM_THREADS": "1",
            "TRAINGUARD_AGENT_SOCKET": str(self.agent_socket(i)),
        }
        # Node 0 hosts the rendezvous store, whichever launcher comes up first.
        host = ["--rdzv-conf", f"is_host={int(i == 0)}"]
        if self.cell.launcher == "torchrun":
            extra["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
            cmd = [
                str(TORCHRUN),
                *("--nnodes", str(self.ACTIVE), "--nproc-per-node", str(PER_NODE)),
                *("--max-restarts", str(self.max_restarts), "--rdzv-backend", "c10d"),
                *("--rdzv-endpoint", f"127.0.0.1:{self.rdzv}", "--rdzv-id", self.job),
                *host,
                str(INJECT),
                *self.script_args(),
            ]
        else:
            extra.update(demojob.simulation_env(3))
            line = demojob.launcher_command(
                self.ACTIVE,
                PER_NODE,
                self.rdzv,
                self.job,
                self.max_restarts,
                self.script_args(),
                script=INJECT,
            )
            at = line.index(str(INJECT))
            cmd = [*line[:at], *host, *line[at:]]
        self.launchers.append(self.start(f"launcher{i}", cmd, **extra))

    def live(self, after: float = 0.0, steps: int = 12) -> list[dict[str, Any]] | None:
        ranks = [r for r in self.ranks() if r["alive"]]
        world = self.ACTIVE * PER_NODE
        if len(ranks) != world or len({r["rank"] for r in ranks}) != world:
            return None
        got = self.get(f"/jobs/{self.job}/steps", since=after, limit=10000)
        cols = got.get("columns", got)
        done: dict[int, set[int]] = {}
        for rank, step in zip(cols.get("rank", []), cols.get("step", []), strict=False):
            done.setdefault(rank, set()).add(step)
        return ranks if all(len(done.get(r["rank"], ())) >= steps for r in ranks) else None


def spare_listed(stack: SpareStack, node: str = "mx-node2") -> dict[str, Any] | None:
    """The job's shape once `node`'s agent lists its launcher as a spare that could join."""
    shape = stack.get(f"/jobs/{stack.job}")["shape"]
    spares = [(s["node"], s["launcher"], s["available"]) for s in shape["spares"]]
    return shape if spares == [(node, stack.cell.launcher, True)] else None


def reshaped(stack: SpareStack) -> dict[str, Any] | None:
    shape = stack.get(f"/jobs/{stack.job}")["shape"]
    return shape if shape["active"] == ["mx-node0", "mx-node2"] else None


@pytest.mark.timeout(480)
@pytest.mark.parametrize("launcher", ["torchrun", "ft_launcher"])
def test_an_excluded_node_leaves_the_job_and_the_spare_takes_its_place(
    tmp_path: Path, launcher: str
) -> None:
    stack = SpareStack(tmp_path, launcher)
    with stack.running():
        ranks = wait_for(stack.live, 240, 0.5)
        stack.launch_node(2)  # the spare: the round is full, it waits
        # The job's shape: its agent lists the waiting launcher (the job has no rank there).
        before = wait_for(lambda: spare_listed(stack), 60, 0.5)
        assert before["active"] == ["mx-node0", "mx-node1"], before
        assert (before["min_nodes"], before["max_nodes"], before["excluded"]) == (2, 2, []), before
        assert stack.get("/jobs")[0]["spare_capacity"] == 1
        assert {r["node"] for r in stack.ranks() if r["alive"]} == {"mx-node0", "mx-node1"}
        (victim,) = [r for r in ranks if r["node"] == "mx-node1" and r["rank"] % PER_NODE]
        t0 = time.time()
        (stack.faults / f"xid.{victim['rank']}").write_text("")

        def closed() -> dict[str, Any] | None:
            incs = stack.incidents()
            return incs[0] if incs and incs[0]["status"] != "open" else None

        inc = stack.incident(wait_for(closed, 300, 0.5)["id"])
        assert (inc["cause"], inc["level"], inc["status"]) == ("xid 79", "exclude_node", "resolved")
        assert inc["outcome"] == "resumed; mx-node2 took the place of mx-node1", inc
        assert sorted((c["node"], c["action"]) for c in inc["commands"]) == [
            ("mx-node0", "launcher"),
            ("mx-node1", "exclude_node"),
        ]
        decision = inc["decisions"][-1]
        assert decision["leave"].startswith("mx-node1 left: ended pid"), decision
        assert stack.launchers[1].wait(30) is not None  # the node's launcher is gone
        assert stack.get("/nodes/mx-node1")["cordoned"] is True
        t = inc["timeline"]
        marks = [t[k] for k in ("fault_at", "detected_at", "decided_at", "resumed_at")]
        assert marks == sorted(marks), t
        assert decision["left_at"] <= t["resumed_at"]
        # Training goes on on node 0 and the spare, from the last checkpoint.
        after = wait_for(lambda: stack.live(after=t0), 240, 0.5)
        assert {r["node"] for r in after} == {"mx-node0", "mx-node2"}
        # The shape: node 0 and the former spare train, node 1 is out, no spare is left.
        shape = wait_for(lambda: reshaped(stack), 60, 0.5)
        assert [(x["node"], x["incident_id"]) for x in shape["excluded"]] == [
            ("mx-node1", inc["id"])
        ], shape
        assert (shape["spares"], shape["spare_capacity"]) == ([], 0), shape
        got = stack.get(f"/jobs/{stack.job}/steps", since=t["resumed_at"] - 1, limit=100000)
        first = min(got["columns"]["step"])
        # From the last checkpoint, not from scratch: the new ranks restored it.
        restores = stack.get(
            "/events", job=stack.job, kind="checkpoint", since=t["fault_at"], limit=1000
        )
        restored = {
            e["data"].get("step")
            for e in restores
            if str(e["data"].get("phase", "")).startswith("restore")
        }
        assert first > 0 and first in restored, (first, restores)
        print(f"fault -> resumed {t['resumed_at'] - t['fault_at']:.2f} s")
        # Readmitted (by an operator here; automatically after readmit_after_s), the node
        # gets a launcher again, as a scheduler would give it, and waits as the new spare.
        r = stack.http.post("/nodes/mx-node1/uncordon", json={"reason": "GPU replaced"})
        assert r.status_code == 200 and r.json()["changed"] is True, r.text
        stack.launch_node(1)
        again = wait_for(lambda: spare_listed(stack, "mx-node1"), 60, 0.5)
        assert again["active"] == ["mx-node0", "mx-node2"], again
        assert stack.get("/jobs")[0]["spare_capacity"] == 1
        assert {r["node"] for r in stack.ranks() if r["alive"]} == {"mx-node0", "mx-node2"}
