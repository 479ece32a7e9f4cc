"""One count of lost steps (issue #33 item 5): an incident's lost steps are an estimate
(fault step - the last checkpoint's) until the job's first steps after its restart are
stored, then the steps its recovery redid, by goodput's definition of wasted steps; over
a job, the incidents' lost steps add up to its goodput's `wasted_steps`. Through the
ingest, the engine, the acks and GET /api/v1/incidents/{id} and /jobs/{job}/goodput, on
SQLite and PostgreSQL.

Two 2-rank jobs, 1 s steps, a checkpoint every 10 steps (times in s from each job's start):

cold (torchrun, no Wrapper; launcher restarts from the checkpoint):
    1-126 ..... attempt 0: steps 0..124; an exception says step 121 at 123.1; the ranks
                step on to 124 before their workers are ended          estimate 121-120 = 1
    129 ....... attempt 1 from the checkpoint of step 120: steps 121..145; resumed acked
                at 130.2, before any step of attempt 1 is stored        redone 121..124 = 4
    154.3 ..... rank 0 killed after step 145 (estimate 145-140 = 5)
    160 ....... attempt 2 from step 140's checkpoint: 141..150; resolved from the steps
                (no resumed ack)                                        redone 141..145 = 5
warm (ft_launcher, the Wrapper; in-process restarts from memory):
    1-155 ..... iteration 0: steps 0..153; rank 1 raises in step 154     estimate 153-150 = 3
    156 ....... iteration 1 from memory: steps 154..163; rank 1 raises in step 163 after
                rank 0 completed it (estimate 163-160 = 3)              redone nothing = 0
    168 ....... iteration 2 repeats step 163: 163..175                  redone 163 = 1

Before the fix the incidents kept their estimates: cold 1 + 5 (goodput 9), warm 3 + 3
(goodput 1); and in the three restarts below 7 + 4 + 1, while goodput counted 31, leaving
out the steps 61..71 that the third restart discarded and the job had not run again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from tests.backend.engine.conftest import Cluster
from trainguard.protocol import wire

NO_COOLDOWN = "[limits]\ncooldown_s = 0\n"


class Job:
    """One 2-rank job on one node, reported as its agent would."""

    def __init__(self, c: Cluster, name: str, node: str, wrapper: bool) -> None:
        self.c, self.name, self.node, self.wrapper = c, name, node, wrapper
        self.t0 = c.clock.t
        self.gen = (0, 0)
        self.post(
            events=[wire.Event(kind="rank_start", ts=self.t0, job=name, rank=r) for r in (0, 1)]
        )

    def post(self, **kw: Any) -> None:
        attempt, iteration = self.gen
        ranks = [
            wire.RankStatus(
                job=self.name,
                rank=r,
                pid=1000 * attempt + 10 * r + 1,
                world_size=2,
                attempt=attempt,
                iteration=iteration,
                in_process=self.wrapper,
                launcher="ft_launcher" if self.wrapper else "torchrun",
            )
            for r in (0, 1)
        ]
        self.c.post(self.node, ranks=ranks, **kw)

    def at(self, offset: float) -> None:
        """The clock moves to the job's t0 + offset."""
        self.c.clock.t = self.t0 + offset

    def steps(self, numbers: Iterable[int], start: float, ranks: tuple[int, ...] = (0, 1)) -> float:
        """1 s steps of the current generation from t0 + start (rank 1 starts each 0.01 s
        later and ends it 0.02 s later), reported once they are all done, with a
        checkpoint save after every tenth; returns the last end offset."""
        attempt, iteration = self.gen
        reports, events, t = [], [], start
        for n in numbers:
            for r in ranks:
                reports.append(
                    wire.StepReport(
                        job=self.name,
                        rank=r,
                        step=n,
                        start=self.t0 + t + 0.01 * r,
                        end=self.t0 + t + 1 + 0.02 * r,
                        attempt=attempt,
                        iteration=iteration,
                    )
                )
            t += 1
            if n % 10 == 0 and ranks == (0, 1):
                data = {"phase": "save_end", "step": n, "ok": True}
                events.append(
                    wire.Event(kind="checkpoint", ts=self.t0 + t, job=self.name, rank=0, data=data)
                )
        self.at(max(self.c.clock.t - self.t0, t + 0.1))
        self.post(steps=reports, events=events)
        return t

    def fault(self, kind: str, offset: float, rank: int, **data: Any) -> None:
        self.at(max(self.c.clock.t - self.t0, offset + 0.2))
        ev = wire.Event(kind=kind, ts=self.t0 + offset, job=self.name, rank=rank, data=data)
        self.post(events=[ev])

    def goodput(self) -> dict[str, Any]:
        r = self.c.client.get(f"/api/v1/jobs/{self.name}/goodput", params={"window": "all"})
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    def lost(self) -> list[int | None]:
        """Each incident's lost steps, oldest first, as GET /incidents/{id} gives them (and
        the list, the same)."""
        listed = self.c.incidents(self.name)
        one = [self.c.client.get(f"/api/v1/incidents/{i['id']}").json() for i in listed]
        assert [i["lost_steps"] for i in listed] == [i["lost_steps"] for i in one]
        return [i["lost_steps"] for i in one]


def _acks(c: Cluster, inc: dict[str, Any], *phases: str) -> None:
    for cmd in inc["commands"]:
        c.ack(cmd["id"], cmd["node"], *phases)


def test_a_launcher_restart_loses_the_steps_it_redoes_from_the_checkpoint(
    make_cluster: Any,
) -> None:
    c: Cluster = make_cluster(NO_COOLDOWN)
    job = Job(c, "cold", "n1", wrapper=False)
    job.steps(range(125), 1)  # 0..124, ends at 126
    job.fault("exception", 123.1, rank=1, step=121)
    c.decide()
    (a,) = c.incidents("cold")
    assert (a["level"], a["fault_step"], a["lost_steps"]) == ("launcher", 121, 1)
    # The restart: attempt 1 from step 120's checkpoint starts at 129; the agent acks
    # `resumed` at 130.2, before the batch with its first steps is stored.
    job.at(130.2)
    _acks(c, a, "delivered", "torn_down", "restarted", "resumed")
    assert c.incidents("cold")[0]["status"] == "resolved"
    assert job.lost() == [1]  # still the estimate: no step of the restart yet
    job.gen = (1, 0)
    job.steps(range(121, 146), 129)  # 121..145, ends at 154
    assert job.lost() == [4]  # 121..124 done again
    assert job.goodput()["wasted_steps"] == 4

    # Rank 0 is killed after step 145; the launcher's attempt 2 resumes from step 140.
    job.fault("rank_exit", 154.3, rank=0, signal=9, last_step=145)
    c.decide()
    a, b = c.incidents("cold")
    assert (b["level"], b["fault_step"], b["lost_steps"]) == ("launcher", 145, 5)
    _acks(c, b, "delivered")  # ... and no other ack: the sweep resolves it from the steps
    job.gen = (2, 0)
    job.steps(range(141, 151), 160)  # 141..150, ends at 170
    job.at(173)
    c.decide()
    b = c.incidents("cold")[1]
    assert b["status"] == "resolved" and "from the job's steps" in b["outcome"]
    assert job.lost() == [4, 5]
    assert job.goodput()["wasted_steps"] == 4 + 5


def test_in_process_restarts_from_memory_lose_only_the_step_they_repeat(
    make_cluster: Any,
) -> None:
    c: Cluster = make_cluster(NO_COOLDOWN)
    job = Job(c, "warm", "n2", wrapper=True)
    job.steps(range(154), 1)  # 0..153, ends at 155
    job.fault("exception", 155.3, rank=1, step=153)
    c.decide()
    (a,) = c.incidents("warm")
    assert (a["level"], a["lost_steps"]) == ("in_process", 3)
    job.at(157.5)  # iteration 1 started at 156; its first step ended at 157
    _acks(c, a, "delivered", "torn_down", "restarted", "resumed")
    assert job.lost() == [3]  # the estimate until its steps are stored
    job.gen = (0, 1)
    job.steps(range(154, 163), 156)  # 154..162 on both ranks, to 165
    job.steps(range(163, 164), 165, ranks=(0,))  # rank 1 raises in 163 after rank 0 did it
    assert job.lost() == [0]  # it went on from memory
    job.fault("exception", 165.8, rank=1, step=163)
    c.decide()
    _, b = c.incidents("warm")
    assert (b["level"], b["lost_steps"]) == ("in_process", 3)
    job.at(169.5)
    _acks(c, b, "delivered", "torn_down", "restarted", "resumed")
    job.gen = (0, 2)
    job.steps(range(163, 176), 168)  # step 163 again, to 175
    assert job.lost() == [0, 1]
    assert job.goodput()["wasted_steps"] == 1


@pytest.mark.parametrize("resume_ack", [True, False], ids=["acked", "from-steps"])
def test_incidents_add_up_to_goodputs_wasted_steps(make_cluster: Any, resume_ack: bool) -> None:
    """Three launcher restarts in a row, the second before the first's redo reached the
    fault's step, the third from further back than the second: each discarded execution
    belongs to the one restart that discarded it, and the sum is goodput's count."""
    c: Cluster = make_cluster(NO_COOLDOWN)
    job = Job(c, "three", "n1", wrapper=False)
    end = job.steps(range(48), 1)  # attempt 0: 0..47
    last = 47
    # (resumes from, steps it runs): attempt 1 40..44, attempt 2 42..71, attempt 3 41..60
    for i, (resume, run) in enumerate([(40, 5), (42, 30), (41, 20)]):
        job.fault("rank_exit", end + 0.3, rank=1, signal=9, last_step=last)
        c.decide()
        inc = c.incidents("three")[i]
        assert inc["level"] == "launcher"
        _acks(c, inc, "delivered", "torn_down", "restarted")
        job.gen = (i + 1, 0)
        start = end + 3
        if resume_ack:
            job.at(start + 1.2)  # its first step ended at start + 1
            _acks(c, inc, "resumed")
        end = job.steps(range(resume, resume + run), start)
        last = resume + run - 1
        if not resume_ack:
            job.at(end + 3)
            c.decide()
        assert c.incidents("three")[i]["status"] == "resolved"
    # 40..47 of attempt 0 (45..47 never ran again before the next fault: discarded all
    # the same); 42..44 of attempt 1; 41 of attempt 1 and 42..71 of attempt 2.
    assert job.lost() == [8, 3, 1 + 30]
    assert job.goodput()["wasted_steps"] == 8 + 3 + 31
