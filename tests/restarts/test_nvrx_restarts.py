"""Real restarts of the demo job: NVRx's in-process Wrapper and ft_launcher on torch
gloo (CPU), driven by seeded faults, observed through the agents' SDK servers.
Heavy on a 2-core machine: each test runs 4 training processes."""

from __future__ import annotations

from collections import Counter

import pytest

from .harness import fault_time, launch_demo, launch_plain, recovery_s

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_exception_on_rank_1_is_an_in_process_restart(tmp_path) -> None:
    c = launch_demo(
        tmp_path,
        job="exc",
        steps=50,
        ckpt_every=10,
        faults=1,
        fault_after_step=25,
        fault_kinds="exception",
        fault_rank=1,
    )
    try:
        assert c.wait(240) == [0, 0], c.logs()
        fault = next(e for e in c.kinds("log") if e.message.startswith("injecting"))
        fault_step = int(fault.data["step"])
        assert fault.rank == 1
        # same processes (4 registrations), one new Wrapper iteration on every rank
        assert len(c.kinds("rank_start")) == 4
        restarts = [e for e in c.kinds("restart") if e.data.get("level") == "in_process"]
        assert sorted(e.rank for e in restarts) == [0, 1, 2, 3]
        after = [s for s in c.steps if s.step > fault_step]
        assert {s.rank for s in after} == {0, 1, 2, 3}
        assert {(s.attempt, s.iteration) for s in after} == {(0, 1)}
        assert max(s.step for s in c.steps) == 49
        worlds = {e.data["world_size"] for e in c.kinds("rank_start")}
        assert worlds == {4}
        print(f"exception: fault -> next step {recovery_s(c, fault_time(c)):.2f} s")
    finally:
        c.close()


def test_sigkill_of_a_worker_is_a_launcher_restart_from_the_last_checkpoint(tmp_path) -> None:
    c = launch_demo(
        tmp_path,
        job="kill",
        steps=50,
        ckpt_every=10,
        faults=1,
        fault_after_step=25,
        fault_kinds="sigkill",
        fault_rank=2,
    )
    try:
        assert c.wait(240) == [0, 0], c.logs()
        fault = next(e for e in c.kinds("log") if e.message.startswith("injecting"))
        fault_step = int(fault.data["step"])
        # the signal is known when the agent saw the zombie before the launcher reaped it
        exits = c.kinds("rank_exit")
        assert [e.rank for e in exits if e.data.get("signal") == 9] in ([2], [])
        assert any(e.rank == 2 and e.data.get("signal") in (9, None) for e in exits)
        assert len(c.kinds("rank_start")) == 8  # a new generation of 4 processes
        restored = [e for e in c.kinds("checkpoint") if e.data.get("phase") == "restore_end"]
        assert len(restored) == 4
        ckpt_step = int(restored[0].data["step"])
        assert ckpt_step % 10 == 0 and 0 < ckpt_step <= fault_step
        new_gen = [s for s in c.steps if s.attempt == 1]
        assert min(s.step for s in new_gen) == ckpt_step  # resumed from the checkpoint
        assert max(s.step for s in new_gen) == 49
        print(
            f"sigkill: fault -> next step {recovery_s(c, fault_time(c)):.2f} s, "
            f"resumed at checkpoint step {ckpt_step} (fault at step {fault_step})"
        )
    finally:
        c.close()


def test_sigkill_of_rank_0_survives_in_process_with_the_agent_hosted_store(tmp_path) -> None:
    # plain processes and a Wrapper that continues with fewer ranks: the survivors restart
    # in process, which needs the Wrapper's store to outlive rank 0
    c = launch_plain(
        tmp_path,
        3,
        [
            "--steps",
            "40",
            "--ckpt-every",
            "10",
            "--faults",
            "1",
            "--fault-after-step",
            "15",
            "--fault-kinds",
            "sigkill",
            "--fault-rank",
            "0",
            "--min-world-size",
            "1",
        ],
    )
    try:
        codes = c.wait(240)
        assert codes[0] == -9 and codes[1:] == [0, 0], c.logs()
        assert len(c.kinds("rank_start")) == 3  # nobody was restarted as a new process
        restarts = [e for e in c.kinds("restart") if e.data.get("level") == "in_process"]
        assert len(restarts) == 2
        fault = next(e for e in c.kinds("log") if e.message.startswith("injecting"))
        after = [s for s in c.steps if s.end > fault.ts and s.iteration == 1]
        # This failed once in a full run (only rank 1 had such steps) and passed 12 runs
        # of 12 alone beside a CPU hog: should it fail again, say what every step after
        # the fault was attributed to, with the ranks' own logs.
        seen = Counter((s.rank, s.iteration) for s in c.steps if s.end > fault.ts)
        why = f"steps after the fault by (rank, iteration): {dict(seen)}\n{c.logs()}"
        assert {s.rank for s in after} == {0, 1}, why  # old ranks 1, 2 are now 0, 1 of 2
        assert max(s.step for s in after) == 39
        print(f"rank 0 sigkill: fault -> next step {recovery_s(c, fault_time(c)):.2f} s")
    finally:
        c.close()
