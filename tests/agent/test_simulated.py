from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from trainguard.agent.collectors.simulated import SimulatedGpus
from trainguard.agent.config import AgentConfig
from trainguard.agent.daemon import build_agent
from trainguard.agent.ranks.server import LocalServer
from trainguard.agent.uplink.outbox import Outbox
from trainguard.protocol.messages import Hello
from trainguard.protocol.wire import Event, GpuInfo, GpuSample, encode

T0 = 1_700_000_000.0


def run(sim: SimulatedGpus, seconds: int, start: float = T0) -> list[list[GpuSample]]:
    return [sim.sample(start + t) for t in range(seconds)]


def test_simulated_gpus_are_labelled_all_the_way():
    sim = SimulatedGpus(2, "node-a", seed=1)
    inv = sim.inventory()
    assert [g.uuid for g in inv] == ["GPU-sim-node-a-0", "GPU-sim-node-a-1"]
    assert all(g.driver == "simulated" and g.name.startswith("Simulated") for g in inv)
    assert sim.simulated is True
    for g in inv:
        msgspec.json.decode(encode(g), type=GpuInfo)


def test_readings_move_like_training_and_fit_the_wire():
    series = run(SimulatedGpus(1, "n", seed=3), 240)
    gpu0 = [s[0] for s in series]
    for s in gpu0:
        msgspec.json.decode(encode(s), type=GpuSample)
    steady = gpu0[60:]
    assert sum(s.util for s in steady) / len(steady) > 80  # training keeps the GPU busy
    assert gpu0[0].util < 10  # warm-up starts idle
    assert gpu0[200].temp_c > gpu0[0].temp_c + 15  # temperature follows power
    energies = [s.energy_mj for s in gpu0]
    assert energies == sorted(energies) and energies[-1] > energies[0]
    assert len({s.power_w for s in steady}) > 50  # readings change
    assert all(0 < s.mem_used_mib <= s.mem_total_mib for s in gpu0)


def test_readings_repeat_from_seed_and_node():
    a = run(SimulatedGpus(2, "n1", seed=7), 30)
    b = run(SimulatedGpus(2, "n1", seed=7), 30)
    c = run(SimulatedGpus(2, "n2", seed=7), 30)
    assert a == b
    assert [s.power_w for s in a[-1]] != [s.power_w for s in c[-1]]


def test_inject_xid_puts_an_urgent_labelled_event():
    outbox = Outbox()
    sim = SimulatedGpus(2, "n", outbox=outbox, clock=lambda: T0)
    event = sim.inject_xid(1, 13, "boom")
    assert outbox.urgent.is_set()
    (e,) = outbox.drain(10, 10, 10).events
    assert e == event
    assert (e.kind, e.xid, e.gpu_uuid, e.message, e.ts) == ("xid", 13, "GPU-sim-n-1", "boom", T0)
    assert e.data == {"source": "injected", "action": "RESTART_APP", "pci": "0000:2a:00"}


class Clock:
    """The simulated node's wall clock, moved by the test."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_xid_79_makes_every_reading_missing_and_without_reboot_the_gpu_stays_lost():
    clock = Clock(T0 + 5)
    sim = SimulatedGpus(2, "n", clock=clock, reboot_after_s=None)
    run(sim, 5)
    event = sim.inject_xid(0, 79)
    assert "fallen off the bus" in event.message
    for s0, s1 in run(sim, 3600, T0 + 5):
        assert s0 == GpuSample(uuid=s0.uuid, ts=s0.ts)  # nothing but uuid and time
        assert s1.util is not None
    assert sim.is_lost(0)
    sim.reset(0)
    assert sim.sample(T0 + 3606)[0].util is not None


def test_a_gpu_off_the_bus_comes_back_after_a_simulated_reboot():
    clock = Clock(T0 + 60)
    outbox = Outbox()
    sim = SimulatedGpus(2, "n", outbox=outbox, clock=clock, reboot_after_s=40)
    run(sim, 60)
    sim.inject_xid(1, 79)
    outbox.drain(10, 10, 10)  # the xid event
    outbox.urgent.clear()
    # Lost for the whole reboot: every reading missing, and nothing reported.
    for _, s1 in run(sim, 40, T0 + 60):
        assert s1 == GpuSample(uuid=s1.uuid, ts=s1.ts)
    assert sim.is_lost(1) and not outbox.drain(10, 10, 10).events
    # The first sample after the power cycle reads the GPU again and says why.
    _, s1 = sim.sample(T0 + 100)
    assert not sim.is_lost(1)
    assert s1.util is not None and s1.util > 50 and s1.temp_c is not None
    assert outbox.urgent.is_set()
    (e,) = outbox.drain(10, 10, 10).events
    assert (e.kind, e.ts, e.gpu_uuid) == ("log", T0 + 100, "GPU-sim-n-1")
    assert e.data == {"simulated": True, "reboot": True, "index": 1, "down_s": 40.0}
    assert "simulated reboot" in e.message
    msgspec.json.decode(encode(e), type=Event)  # fits the wire
    # Once: the next samples are ordinary ones.
    run(sim, 10, T0 + 101)
    assert not outbox.drain(10, 10, 10).events


def test_the_reboot_counts_from_the_first_xid_79_and_reset_cancels_it():
    clock = Clock(T0)
    outbox = Outbox()
    sim = SimulatedGpus(1, "n", outbox=outbox, clock=clock, reboot_after_s=40)
    sim.inject_xid(0, 79)
    clock.now = T0 + 30
    sim.inject_xid(0, 79)  # a second report of the lost GPU does not postpone the reboot
    assert sim.sample(T0 + 39)[0].util is None
    assert sim.sample(T0 + 40)[0].util is not None
    assert [e.data.get("reboot") for e in outbox.drain(10, 10, 10).events] == [None, None, True]
    clock.now = T0 + 50
    sim.inject_xid(0, 79)
    sim.reset(0)  # an operator's reset: back now, and no reboot later
    run(sim, 100, T0 + 50)
    assert [e.kind for e in outbox.drain(10, 10, 10).events] == ["xid"]


def test_reboot_delay_must_be_positive():
    with pytest.raises(ValueError, match="reboot_after_s"):
        SimulatedGpus(1, "n", reboot_after_s=0)


@pytest.mark.parametrize(
    ("xid", "field", "after"),
    [
        (48, "ecc_dbe_volatile", 1),
        (48, "remap_pending", True),
        (63, "remapped_uncorrectable", 1),
        (64, "remap_failure", True),
        (92, "ecc_sbe_volatile", 100),
    ],
)
def test_memory_xids_move_the_counters(xid, field, after):
    sim = SimulatedGpus(1, "n")
    before = getattr(sim.sample(T0)[0], field)
    sim.inject_xid(0, xid)
    assert before in (0, False) and getattr(sim.sample(T0 + 1)[0], field) == after


def test_application_xid_idles_the_gpu_for_a_while():
    sim = SimulatedGpus(1, "n", clock=lambda: T0 + 100)
    run(sim, 100)
    sim.inject_xid(0, 31)
    assert sim.sample(T0 + 101)[0].util == 0
    assert sim.sample(T0 + 130)[0].util > 50


def test_set_slow_lowers_clocks_and_flags_a_slowdown():
    sim = SimulatedGpus(2, "n")
    run(sim, 60)
    sim.set_slow(1, 2.0)
    fast, slow = sim.sample(T0 + 60)
    assert slow.sm_clock_mhz < fast.sm_clock_mhz and slow.clock_event_reasons & 0x8
    with pytest.raises(ValueError):
        sim.set_slow(0, 0.5)


def test_bad_injections_are_refused():
    sim = SimulatedGpus(2, "n")
    with pytest.raises(ValueError, match="no simulated GPU 5"):
        sim.inject_xid(5, 79)
    with pytest.raises(ValueError):
        sim.inject_xid(0, -1)


def test_long_node_names_still_give_wire_sized_uuids():
    sim = SimulatedGpus(1, "x" * 128)
    assert len(sim.inventory()[0].uuid) <= 96 and sim.inventory()[0].uuid.startswith("GPU-sim-")


def test_uuid_for_pci():
    sim = SimulatedGpus(3, "n")
    assert sim.uuid_for_pci("0000:3a:00") == "GPU-sim-n-2"
    assert sim.uuid_for_pci("0000:99:00") is None


class Ranks:
    """Whether a training rank is alive on the node, as the agent's rank table answers."""

    def __init__(self, alive: bool = False) -> None:
        self.alive = alive

    def __call__(self) -> bool:
        return self.alive


def test_gpus_idle_while_no_rank_runs_on_the_node():
    sim = SimulatedGpus(2, "n", seed=5, ranks_alive=Ranks(alive=False))
    idle = [s for batch in run(sim, 300) for s in batch][100:]
    assert max(s.util for s in idle) < 5
    assert all(55 <= s.power_w <= 95 for s in idle)  # an H100's idle draw
    assert max(s.temp_c for s in idle) < 40
    assert max(s.mem_used_mib for s in idle) < 1024  # the driver's context only
    assert all(s.sm_clock_mhz < 500 and s.clock_event_reasons & 0x1 for s in idle)  # GPU_IDLE


def test_gpus_load_up_when_a_rank_starts_and_idle_again_when_it_ends():
    ranks = Ranks(alive=False)
    sim = SimulatedGpus(1, "n", seed=5, ranks_alive=ranks)
    before = [s[0] for s in run(sim, 60)]
    ranks.alive = True
    training = [s[0] for s in run(sim, 240, start=T0 + 60)]
    ranks.alive = False
    after = [s[0] for s in run(sim, 120, start=T0 + 300)]

    assert training[0].util < 10  # a job warms the GPU up from idle
    steady = training[60:]
    assert sum(s.util for s in steady) / len(steady) > 80
    assert min(s.power_w for s in steady[-60:]) > 300
    assert steady[-1].temp_c > before[-1].temp_c + 15
    assert steady[-1].mem_used_mib > 60_000
    assert max(s.util for s in after) < 5  # the job ended: idle at once
    assert after[-1].power_w < 95 and after[-1].mem_used_mib < 1024
    assert after[-1].temp_c < steady[-1].temp_c - 15  # and cooling down
    for s in after:
        msgspec.json.decode(encode(s), type=GpuSample)


def test_the_agent_tells_its_simulated_gpus_whether_a_rank_runs_on_the_node(tmp_path: Path):
    cfg = AgentConfig(
        node="n1",
        simulate=2,
        spool_dir=tmp_path / "spool",
        socket_path=tmp_path / "agent.sock",
        kmsg_path=None,
    )
    agent = build_agent(cfg)
    assert agent.simulated is not None
    assert agent.simulated.ranks_alive == agent.ranks_alive
    assert agent.ranks_alive() is False  # no SDK server: no rank can run here
    local = LocalServer(agent)
    agent.add_component(local)
    assert agent.ranks_alive() is False
    rec = local.table.register(Hello(job="j", rank=0, pid=4242), 0, T0)
    assert agent.ranks_alive() is True
    assert agent.simulated.sample(T0)[0].util is not None
    rec.alive = False  # its process exited; the record stays for a while
    assert agent.ranks_alive() is False
