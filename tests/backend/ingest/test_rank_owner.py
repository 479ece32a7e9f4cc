"""A rank number lives where its newest process runs. After an exclusion the spare's
ranks take the excluded node's rank numbers; once that node is readmitted its agent still
lists the old processes, dead, in every batch. Those reports must not take the ranks back:
the job's ranks (and every engine decision read from them) stay on the spare, alive.
Through the real ingest on both databases."""

from __future__ import annotations

import time
from typing import Any

from trainguard.protocol import wire

JOB = "owner"


def _post(client: Any, node: str, seq: int, ranks: list[wire.RankStatus]) -> None:
    batch = wire.Batch(
        node=node, agent_id=f"agent-{node}", seq=seq, sent_at=time.time(), ranks=ranks
    )
    r = client.post("/api/v1/ingest", content=wire.encode(batch))
    assert r.status_code == 200, r.text


def _rank(rank: int, pid: int, alive: bool = True) -> wire.RankStatus:
    return wire.RankStatus(job=JOB, rank=rank, pid=pid, world_size=2, alive=alive)


def _ranks(client: Any) -> dict[int, tuple[str, bool, int]]:
    body = client.get(f"/api/v1/jobs/{JOB}").json()
    return {r["rank"]: (r["node"], r["alive"], r["pid"]) for r in body["ranks"]}


def test_a_dead_process_listed_by_another_node_does_not_take_the_rank_back(client: Any) -> None:
    _post(client, "old-node", 1, [_rank(1, 100)])
    _post(client, "spare-node", 1, [_rank(1, 200)])  # the spare's process took rank 1
    assert _ranks(client)[1] == ("spare-node", True, 200)
    _post(client, "old-node", 2, [_rank(1, 100, alive=False)])  # readmitted, lists the old one
    assert _ranks(client)[1] == ("spare-node", True, 200)


def test_the_node_where_the_rank_runs_still_reports_its_end(client: Any) -> None:
    _post(client, "old-node", 1, [_rank(1, 100)])
    _post(client, "spare-node", 1, [_rank(1, 200)])
    _post(client, "spare-node", 2, [_rank(1, 200, alive=False)])
    assert _ranks(client)[1] == ("spare-node", False, 200)
    # A dead rank's row may be taken by any node's report, alive or not.
    _post(client, "old-node", 2, [_rank(1, 100, alive=False)])
    assert _ranks(client)[1] == ("old-node", False, 100)
