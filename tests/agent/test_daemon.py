from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import httpx

import trainguard.agent.daemon as daemon
from trainguard.agent.collectors.nvml import Nvml, NvmlCollector
from trainguard.agent.collectors.simulated import SimulatedGpus
from trainguard.agent.collectors.xid_watchers import KmsgWatcher, XidWatcher
from trainguard.agent.config import AgentConfig
from trainguard.agent.daemon import Agent, AgentSetupError, build_agent, main
from trainguard.protocol.wire import Batch, decode_batch


class Backend:
    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        b = decode_batch(request.content)
        with self.lock:
            self.batches.append(b)
        return httpx.Response(200, json={"seq": b.seq, "duplicate": False})

    def events(self, kind: str | None = None) -> list:
        with self.lock:
            return [e for b in self.batches for e in b.events if kind in (None, e.kind)]

    def samples(self) -> list:
        with self.lock:
            return [s for b in self.batches for s in b.samples]


def cfg(tmp_path: Path, **kw) -> AgentConfig:
    kw.setdefault("interval", 0.02)
    return AgentConfig(node="node-1", server="http://backend", spool_dir=tmp_path / "spool", **kw)


class Recorder:
    def __init__(self, log: list[str], name: str, fail: bool = False) -> None:
        self.log, self.name, self.fail = log, name, fail

    def start(self) -> None:
        if self.fail:
            raise OSError("address already in use")
        self.log.append(f"start {self.name}")

    def stop(self) -> None:
        self.log.append(f"stop {self.name}")


def run_in_thread(agent: Agent) -> tuple[threading.Thread, list[int]]:
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(agent.run()))
    t.start()
    return t, result


def test_main_without_a_driver_prints_one_line_and_returns_2(tmp_path, monkeypatch, capsys):
    import pynvml

    class NoDriver:
        NVMLError = pynvml.NVMLError

        def nvmlInit(self) -> None:
            raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(daemon, "Nvml", lambda: Nvml(NoDriver()))
    assert main(cfg(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err == (
        "trainguard agent: no NVIDIA driver found (NVML: NVML Shared Library Not Found); "
        "use --simulate N for simulated GPUs\n"
    )


def test_a_spool_held_by_another_agent_is_a_setup_error(tmp_path):
    first = build_agent(cfg(tmp_path, simulate=1))
    try:
        build_agent(cfg(tmp_path, simulate=1))
    except AgentSetupError as exc:
        assert "in use by another agent" in str(exc)
    else:
        raise AssertionError("expected AgentSetupError")
    finally:
        first.uplink.close()


def test_simulated_agent_streams_labelled_data_and_stops_cleanly(tmp_path, wait_for):
    backend = Backend()
    agent = build_agent(cfg(tmp_path, simulate=2), transport=httpx.MockTransport(backend))
    assert isinstance(agent.simulated, SimulatedGpus) and agent.watchers == []
    log: list[str] = []
    agent.add_component(Recorder(log, "sdk"))
    agent.add_component(Recorder(log, "executor"))
    t, result = run_in_thread(agent)
    wait_for(lambda: len({s.ts for s in backend.samples()}) >= 3, what="three sample rounds")
    agent.simulated.inject_xid(1, 79)
    wait_for(lambda: backend.events("xid"), what="the injected xid")
    agent.stop()
    t.join(10)
    assert result == [0]
    assert log == ["start sdk", "start executor", "stop executor", "stop sdk"]
    first = backend.batches[0]
    assert [g.uuid for g in first.gpus] == ["GPU-sim-node-1-0", "GPU-sim-node-1-1"]
    (start,) = backend.events("agent_start")
    assert start.data["source"] == "simulated" and start.data["agent_id"] == agent.uplink.agent_id
    assert all(b.simulated for b in backend.batches)
    assert [b.seq for b in backend.batches] == list(range(1, len(backend.batches) + 1))
    (xid,) = backend.events("xid")
    assert xid.gpu_uuid == "GPU-sim-node-1-1" and xid.data["source"] == "injected"


def test_a_component_that_cannot_start_stops_the_agent_with_code_1(tmp_path):
    backend = Backend()
    agent = build_agent(cfg(tmp_path, simulate=1), transport=httpx.MockTransport(backend))
    log: list[str] = []
    agent.add_component(Recorder(log, "a"))
    agent.add_component(Recorder(log, "b", fail=True))
    assert agent.run() == 1
    assert log == ["start a", "stop a"]
    assert backend.events("agent_start")  # flushed on the way out


def test_nvml_agent_reports_an_xid_from_the_event_set(tmp_path, fake_pynvml, wait_for):
    backend = Backend()
    collector = NvmlCollector(Nvml(fake_pynvml))
    config = cfg(tmp_path, kmsg_path=None)
    agent = Agent(config, collector, transport=httpx.MockTransport(backend))
    assert agent.simulated is None and [type(w) for w in agent.watchers] == [XidWatcher]
    t, result = run_in_thread(agent)
    wait_for(lambda: backend.samples(), what="samples")
    fake_pynvml.xid(0, 79)
    wait_for(lambda: backend.events("xid"), what="the xid")
    agent.stop()
    t.join(10)
    assert result == [0]
    (xid,) = backend.events("xid")
    assert (xid.xid, xid.gpu_uuid, xid.data["source"]) == (79, "GPU-fake-0", "nvml")
    assert not any(b.simulated for b in backend.batches)
    assert {s.uuid for s in backend.samples()} == {"GPU-fake-0", "GPU-fake-1"}


def test_a_named_kernel_log_is_followed_for_simulated_gpus(tmp_path):
    log = tmp_path / "kern.log"
    log.touch()
    agent = build_agent(cfg(tmp_path, simulate=1, kmsg_path=log))
    assert [type(w) for w in agent.watchers] == [KmsgWatcher]
    agent.uplink.close()


def test_sigterm_stops_the_agent_gracefully(tmp_path, wait_for):
    backend = Backend()
    agent = build_agent(cfg(tmp_path, simulate=1), transport=httpx.MockTransport(backend))
    before = signal.getsignal(signal.SIGTERM)

    def terminate() -> None:
        wait_for(lambda: backend.samples(), what="samples")
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=terminate)
    killer.start()
    assert agent.run() == 0  # in the main thread, so the handler is installed
    killer.join()
    assert signal.getsignal(signal.SIGTERM) is before
    assert agent.uplink.stats().backlog == 0
