"""Benchmarks for docs/restarts.md (measurements, not assertions).

    python tests/restarts/bench_restarts.py sdk
    python tests/restarts/bench_restarts.py restarts --kind exception --runs 3
        kinds: exception, hang, sigkill, rank0 (SIGKILL of rank 0, agent-hosted store),
               cmd_in_process, cmd_launcher (a command through the agent's executor)

Restart times are seconds from the fault (or the command) to the next completed step of
the slowest rank, as the agents saw them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trainguard import sdk


def bench_sdk(n: int = 200_000, repeats: int = 5) -> None:
    def run(tg: sdk.Session) -> tuple[float, float]:
        ctx, call = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for i in range(n):
                with tg.step(i):
                    pass
            ctx.append((time.perf_counter() - t0) / n * 1e6)
            t0 = time.perf_counter()
            for i in range(n):
                tg.step_done(i, 1.0, 2.0)
            call.append((time.perf_counter() - t0) / n * 1e6)
        return statistics.median(ctx), statistics.median(call)

    def paced(tg: sdk.Session, steps: int = 5000) -> tuple[float, float]:
        """A step every millisecond (the agent keeps up, as in training): the hook's own
        cost per step, median and p99."""
        costs = []
        for i in range(steps):
            t0 = time.perf_counter()
            with tg.step(i):
                pass
            costs.append((time.perf_counter() - t0) * 1e6)
            time.sleep(0.001)
        costs.sort()
        return statistics.median(costs), costs[int(len(costs) * 0.99)]

    with tempfile.TemporaryDirectory() as d:
        tg = sdk.attach(job="bench", socket_path=f"{d}/absent.sock", install_signal_handler=False)
        a, b = run(tg)
        print(
            f"no agent:        with step(): {a:.2f} us/step, step_done(): {b:.2f} us/step "
            f"(dropped {tg.dropped})"
        )
        tg.close()
        # the agent in a process of its own, as on a node
        import subprocess

        server = subprocess.Popen([sys.executable, __file__, "serve", f"{d}/agent.sock"])
        from tests.support import wait_for

        wait_for(lambda: Path(f"{d}/agent.sock").exists(), 20, 0.05)
        try:
            tg = sdk.attach(
                job="bench", socket_path=f"{d}/agent.sock", install_signal_handler=False
            )
            a, b = run(tg)
            print(
                f"agent listening: with step(): {a:.2f} us/step, step_done(): {b:.2f} us/step "
                f"(sent {tg.sent}, dropped {tg.dropped} when the agent's buffer was full)"
            )
            med, p99 = paced(tg)
            print(f"agent listening, a step every ms: median {med:.2f} us, p99 {p99:.2f} us")
            tg.close()
        finally:
            server.terminate()
            server.wait()


def serve(path: str) -> None:
    """A LocalServer alone in this process, until SIGTERM."""
    import signal
    import threading

    from trainguard.agent.ranks.server import LocalServer
    from trainguard.agent.uplink.outbox import Outbox

    class Host:  # the LocalServer needs an outbox; nothing else of an agent
        config = None
        simulated = None

        def __init__(self) -> None:
            self.outbox = Outbox(max_records=10**7)

    server = LocalServer(Host(), socket_path=path)
    server.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    server.stop()


def bench_restart(kind: str, workdir: Path) -> float:
    from tests.restarts.harness import fault_time, launch_demo, launch_plain, recovery_s
    from tests.support import wait_for
    from trainguard.agent.executors.loop import CommandLoop
    from trainguard.protocol.wire import Command

    if kind == "rank0":
        c = launch_plain(
            workdir,
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
    elif kind.startswith("cmd_"):
        c = launch_demo(workdir, job="bench", steps=100000, ckpt_every=10, step_sleep=0.02)
    else:
        c = launch_demo(
            workdir,
            job="bench",
            steps=60,
            ckpt_every=10,
            faults=1,
            fault_after_step=25,
            fault_kinds=kind,
            fault_rank=1 + (kind == "sigkill"),
        )
    try:
        if not kind.startswith("cmd_"):
            codes = c.wait(300)
            if kind != "rank0" and codes != [0, 0]:
                raise RuntimeError(f"job failed {codes}\n{c.logs()}")
            return recovery_s(c, fault_time(c))
        node = c.nodes[0]
        wait_for(
            lambda: c.collect() and len({s.rank for s in c.steps if s.step >= 30}) == 4, 120, 0.2
        )

        class Acks:
            def __init__(self) -> None:
                self.acks: list = []

            def poll(self, node: str, wait: float) -> list:
                return []

            def ack(self, cid: str, ack: object) -> None:
                self.acks.append(ack)

        acks = Acks()
        loop = CommandLoop(
            node.agent, node.local, transport=acks, node="node0", spool_dir=workdir / "cmd"
        )
        level = kind.removeprefix("cmd_")
        t0 = time.time()
        loop.handle(
            Command(
                id=f"b{int(t0)}",
                job="bench",
                action=level,
                node="node0",
                issued_at=t0,
                params={"grace_s": 2.0},
            )
        )
        done = wait_for(
            lambda: acks.acks and acks.acks[-1].phase in ("resumed", "failed") and acks.acks,
            120,
            0.1,
        )
        if done[-1].phase != "resumed":
            raise RuntimeError(f"command failed: {done}\n{c.logs()}")
        print("   ", ", ".join(f"{a.phase} +{a.ts - t0:.2f}" for a in done))
        # the slowest rank, all nodes: first step completed after the command
        return recovery_s(c, t0, restarted_only=True)
    finally:
        c.close()


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("sdk")
    sub.add_parser("serve").add_argument("path")
    r = sub.add_parser("restarts")
    r.add_argument("--kind", required=True)
    r.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    if args.what == "serve":
        serve(args.path)
        return
    if args.what == "sdk":
        bench_sdk()
        return
    times = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as d:
            t = bench_restart(args.kind, Path(d))
            times.append(t)
            print(f"{args.kind} run {i + 1}: {t:.2f} s", flush=True)
    print(
        f"{args.kind}: {min(times):.2f}-{max(times):.2f} s over {len(times)} runs "
        f"(median {statistics.median(times):.2f})"
    )


if __name__ == "__main__":
    main()
