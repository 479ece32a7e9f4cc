"""Every event the agent makes, made by the agent's own code, decodes as the backend
decodes it and reads as its kind's typed data (trainguard.protocol.payloads): a rank's
session through the SDK socket, the liveness checks on real processes, the XID sources,
the agent's start and the spool's gap. Each is checked when made, too (Event's
__post_init__): a producer that broke its kind's Struct would raise here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import wait_for
from trainguard import sdk
from trainguard.agent.collectors.xid_watchers import parse_kmsg_line, report_record, xid_event
from trainguard.agent.config import AgentConfig
from trainguard.agent.daemon import Agent, build_agent
from trainguard.agent.ranks.liveness import Liveness, own_zombie, proc_info
from trainguard.agent.ranks.server import LocalServer
from trainguard.agent.ranks.table import RankRecord, RankTable
from trainguard.agent.uplink.spool import Gap
from trainguard.protocol import payloads, wire


class Outbox:
    def __init__(self) -> None:
        self.events: list[wire.Event] = []

    def put_event(self, event: wire.Event, urgent: bool = False) -> None:
        self.events.append(event)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[Agent, LocalServer]]:
    cfg = AgentConfig(
        node="n1",
        simulate=2,
        spool_dir=tmp_path / "spool",
        socket_path=tmp_path / "agent.sock",
        kmsg_path=None,
    )
    agent = build_agent(cfg)
    local = LocalServer(agent)
    local.start()
    yield agent, local
    local.stop()


def decoded(events: list[wire.Event]) -> list[wire.Event]:
    """`events` as the backend gets them, in JSON and in MessagePack (the same both ways)."""
    batch = wire.Batch(node="n1", agent_id="agent000001", seq=1, sent_at=time.time())
    batch.events = events
    out = wire.decode_batch(wire.encode(batch)).events
    assert wire.decode_batch_msgpack(wire.encode_msgpack(batch)).events == out == events
    return out


def session_events(agent: Agent, local: LocalServer) -> list[wire.Event]:
    """rank_start, checkpoint, log, restart (in process, raised), exception and xid, from a
    rank's session through the SDK socket."""
    tg = sdk.Session(
        job="job1",
        rank=1,
        local_rank=1,
        world_size=2,
        attempt=0,
        socket_path=local.socket_path,
        install_signal_handler=False,
        launcher="torchrun",
        display_name="nightly",
    )
    try:
        rec = wait_for(lambda: local.ranks.get(tg.pid), timeout=10)
        with tg.checkpoint("save", step=3):
            pass
        tg.log("lr changed", lr=0.1, index="free-form")
        tg.report_interrupted("a peer failed")
        tg.restart_iteration(1)
        wait_for(lambda: rec.iteration == 1, timeout=10)
        tg.report_exception(ValueError("bad batch"))
        tg.inject_xid(1, 79, "fault injection")
        assert local.request_restart("job1", "req-1", "test") == [tg.pid]
        wait_for(lambda: tg.restart_requests == 1, timeout=10)
        with pytest.raises(sdk.RestartRequested):
            tg.check_restart()
        wait_for(lambda: "req-1" in rec.restart_raised, timeout=10)
        wait_for(lambda: agent.simulated.is_lost(1), timeout=10)
    finally:
        tg.close()
    return list(agent.outbox.drain(10**6, 10**6, 10**6).events)


def liveness_events() -> list[wire.Event]:
    """rank_exit (an exit code; a stop signal with no launcher), heartbeat_lost and hang,
    from the liveness checks on real processes."""
    outbox = Outbox()
    live = Liveness(RankTable(outbox), hang_first_step_s=1.0, hang_min_s=1.0)  # type: ignore[arg-type]  # the outbox's put_event is all it uses
    for code, sig in ((3, None), (None, signal.SIGTERM)):
        script = f"import os, sys, time; time.sleep(0.05); sys.exit({code})" if code else ""
        p = subprocess.Popen([sys.executable, "-c", script or "import time; time.sleep(60)"])
        if sig is not None:
            p.send_signal(sig)
        rec = RankRecord(pid=p.pid, job="job1", rank=0, ppid=os.getpid())
        live.table.ranks[rec.pid] = rec
        zombie = wait_for(lambda p=p: (i := proc_info(p.pid)) and i.state == "Z" and i, 10)
        live.exited(rec, own_zombie(rec, zombie), time.time())
        p.wait()  # reaped only now: its status was read from /proc, as the agent does
    me = RankRecord(pid=os.getpid(), job="job1", rank=1, last_heartbeat=time.time() - 60)
    live.table.ranks[me.pid] = me
    live.check_rank(me, time.monotonic(), time.time())
    me.last_heartbeat, me.progress_mono = time.time(), time.monotonic() - 5
    live.check_rank(me, time.monotonic(), time.time())
    return outbox.events


def node_events(agent: Agent) -> list[wire.Event]:
    """agent_start and gpu_lost at start (the daemon), xid and gpu_lost from the XID
    sources, and spool_gap (the spool's and the outbox's)."""
    agent.source.unreadable = {0: "GPU is lost"}  # type: ignore[attr-defined]  # as NVML's source sets it
    agent._emit_start()
    outbox = Outbox()
    line = "NVRM: Xid (PCI:0000:18:00): 13, pid=1234, name=python, Graphics Exception"
    record = parse_kmsg_line(line)
    assert record is not None
    report_record(record, outbox, time.time(), "GPU-0")  # type: ignore[arg-type]  # put_event only
    lost = xid_event(79, time.time(), "nvml", "GPU-1", kind="gpu_lost", pci="0000:19:00")
    gap = Gap(batches=2, samples=16, events=1, steps=0, start=time.time() - 9, end=time.time())
    spool = wire.Event(kind="spool_gap", ts=time.time(), data=gap.event_data())
    dropped = agent.uplink._gap_event({"records": 3, "where": "outbox"})
    made = agent.outbox.drain(10**6, 10**6, 10**6).events
    return [*made, *outbox.events, lost, spool, dropped]


def test_every_event_the_agent_makes_decodes_as_its_kind(
    agent: tuple[Agent, LocalServer],
) -> None:
    events = [*session_events(*agent), *liveness_events(), *node_events(agent[0])]
    by_kind: dict[str, list[Any]] = {}
    for e in decoded(events):
        by_kind.setdefault(e.kind, []).append(e.typed_data())
    # straggler and timeouts rows are the backend's own; command phases travel as acks
    backends = {"straggler", "timeouts", "command"}
    assert set(by_kind) == set(payloads.EVENT_DATA) - backends | {"log"}
    for kind, datas in by_kind.items():
        assert all(type(d) is payloads.EVENT_DATA.get(kind, payloads.EventData) for d in datas)
    (start,) = by_kind["rank_start"]
    assert (start.world_size, start.launcher, start.display_name) == (2, "torchrun", "nightly")
    assert [(c.phase, c.step) for c in by_kind["checkpoint"]] == [
        ("save_start", 3),
        ("save_end", 3),
    ]
    assert by_kind["checkpoint"][1].blocking_s >= 0 and by_kind["checkpoint"][1].ok is True
    exited, stopped = by_kind["rank_exit"]
    assert (exited.exit_code, exited.signal, exited.clean) == (3, None, False)
    assert (stopped.signal, stopped.stop_signal, stopped.launcher_exited) == (15, 15, True)
    (lost_hb,) = by_kind["heartbeat_lost"]
    (hang,) = by_kind["hang"]
    assert lost_hb.age_s >= 60 and hang.stalled_s >= 5 and hang.threshold_s == 1.0
    assert {(r.level, r.phase) for r in by_kind["restart"]} == {
        ("in_process", None),
        (None, "raised"),
    }
    (exc,) = by_kind["exception"]
    assert exc.type == "ValueError"
    assert {(x.source, x.pid, x.process) for x in by_kind["xid"]} == {
        ("injected", None, None),
        ("kmsg", 1234, "python"),
    }
    assert {(g.source, g.index, g.pci) for g in by_kind["gpu_lost"]} == {
        (None, 0, None),
        ("nvml", None, "0000:19:00"),
    }
    (start_,) = by_kind["agent_start"]
    assert start_.source == "simulated" and start_.agent_id == agent[0].uplink.agent_id
    spool, dropped = by_kind["spool_gap"]
    assert (spool.batches, spool.samples, spool.end is not None) == (2, 16, True)
    assert (dropped.records, dropped.where) == (3, "outbox")
