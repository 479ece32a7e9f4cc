"""The world's rows as the replay keeps them between two writes (world.py): each rank's
state, and the statements that write the ranks' and jobs' rows at the end of an advance,
each in one executemany."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, bindparam, update
from sqlalchemy.orm import Session

from trainguard.backend.models import Job, Rank


@dataclass
class RankState:
    id: int
    node: str
    pid: int
    attempt: int
    iteration: int
    alive: bool
    updated_at: float
    last_step: int | None
    pid_known: bool = False  # from a rank_start: an exit naming another pid is older
    epoch: int = 0  # registered with its node's agent of this epoch (World.epochs)


_RANKS, _JOBS = cast("Table", Rank.__table__), cast("Table", Job.__table__)
_UPDATE_RANK = (
    update(_RANKS)
    .where(_RANKS.c.id == bindparam("b_id"))
    .values(
        node_id=bindparam("b_node"),
        pid=bindparam("b_pid"),
        attempt=bindparam("b_attempt"),
        iteration=bindparam("b_iteration"),
        alive=bindparam("b_alive"),
        updated_at=bindparam("b_updated_at"),
        last_step=bindparam("b_last_step"),
    )
)
_UPDATE_JOB = (
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("b_id"))
    .values(
        last_seen=bindparam("last_seen"),
        last_step=bindparam("last_step"),
        attempt=bindparam("attempt"),
        iteration=bindparam("iteration"),
    )
)


def write_ranks(s: Session, ranks: Iterable[RankState], node_ids: dict[str, int]) -> None:
    s.execute(
        _UPDATE_RANK,
        [
            {
                "b_id": r.id,
                "b_node": node_ids[r.node],
                "b_pid": r.pid,
                "b_attempt": r.attempt,
                "b_iteration": r.iteration,
                "b_alive": r.alive,
                "b_updated_at": r.updated_at,
                "b_last_step": r.last_step,
            }
            for r in ranks
        ],
    )


def write_jobs(s: Session, jobs: dict[str, dict[str, Any]], job_ids: dict[str, int]) -> None:
    s.execute(_UPDATE_JOB, [{"b_id": job_ids[n], **row} for n, row in jobs.items()])
