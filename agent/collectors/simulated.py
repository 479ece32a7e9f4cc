"""Simulated GPUs for machines without an NVIDIA driver: the same `inventory()/sample(now)`
interface as `NvmlCollector`, readings that move like a data-parallel training job, and
XID injection that changes the GPU's state the way the real fault would.

A GPU that fell off the bus (XID 79) stays lost until the node is power-cycled: here a
simulated reboot brings it back `reboot_after_s` after the XID (None: only `reset()` does),
at the first sample taken from then on, with a `log` event labelled
`data = {"simulated": True, "reboot": True, ...}`. Only the GPU comes back; the node's
processes (a real training job in the demo) are not touched.

The GPUs carry a job's load only while one runs: `ranks_alive` (a callable, the agent's
rank table) says whether a training rank is alive on the node; while none is, they idle
(about 0 % util, ~60-90 W, cooling down, little memory in use) and a job that starts
again warms them up from idle. Without the callable they always carry a job (a simulator
on its own, as in the readings' tests).

Everything is labelled: uuids are `GPU-sim-<node>-<i>`, the driver is "simulated", batches
carry `simulated=True`, injected XIDs carry `data.source = "injected"`. Readings are
repeatable from (seed, node) and the sequence of `now` values.
"""

from __future__ import annotations

import math
import random
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from trainguard.agent.collectors.nvml import pci_key
from trainguard.agent.collectors.xid_watchers import xid_event
from trainguard.agent.uplink.outbox import Outbox
from trainguard.protocol.wire import Event, GpuInfo, GpuSample
from trainguard.protocol.xid import describe_xid

MEM_TOTAL_MIB = 81559.0  # what an H100 80GB HBM3 reports
POWER_LIMIT_W = 700.0
IDLE_W = 72.0
WARMUP_S = 20.0
CKPT_EVERY_S, CKPT_LEN_S = 300.0, 8.0
APP_RESTART_S = 15.0  # util stays at 0 after an application-level XID
REBOOT_AFTER_S = 40.0  # a lost GPU comes back after a simulated power cycle of this long
# NVML clocks-event-reason bits
GPU_IDLE, HW_SLOWDOWN, SW_THERMAL = 0x1, 0x8, 0x20
_BUSES = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]
_RESET_GPU = {46, 62, 64, 95, 109, 119, 120, 140, 143}


@dataclass
class _Gpu:
    index: int
    uuid: str
    pci: str
    temp: float
    energy_mj: float
    last_ts: float | None = None
    lost: bool = False
    lost_at: float = 0.0  # when the XID 79 came (the simulated reboot counts from it)
    hung: bool = False
    idle_until: float = 0.0
    slow: float = 1.0
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    remap_corr: int = 0
    remap_unc: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    pcie_replay: int = 0


def sim_uuid(node: str, index: int) -> str:
    """`GPU-sim-<node>-<i>`, shortened with a checksum when the node name is long."""
    uuid = f"GPU-sim-{node}-{index}"
    if len(uuid) <= 96:
        return uuid
    return f"GPU-sim-{node[:64]}-{zlib.crc32(node.encode()):08x}-{index}"


class SimulatedGpus:
    simulated = True

    def __init__(
        self,
        n: int,
        node: str,
        seed: int = 0,
        outbox: Outbox | None = None,
        clock: Callable[[], float] = time.time,
        reboot_after_s: float | None = REBOOT_AFTER_S,
        ranks_alive: Callable[[], bool] | None = None,
    ) -> None:
        if n < 1:
            raise ValueError(f"need at least one simulated GPU, got {n}")
        if reboot_after_s is not None and not 0 < reboot_after_s <= 86400:
            raise ValueError(f"reboot_after_s must be between 0 and 86400 s, got {reboot_after_s}")
        self.node, self.outbox, self.clock = node, outbox, clock
        self.reboot_after_s = reboot_after_s
        self.ranks_alive = ranks_alive
        self._rng = random.Random(f"{seed}:{node}")
        self._lock = threading.Lock()
        self._t0: float | None = None
        self._phase = self._rng.uniform(0, CKPT_EVERY_S)
        self.gpus = [
            _Gpu(
                index=i,
                uuid=sim_uuid(node, i),
                pci=f"00000000:{_BUSES[i] if i < len(_BUSES) else 0x10 + i:02X}:00.0",
                temp=self._rng.uniform(30, 36),
                energy_mj=self._rng.uniform(1e9, 5e9),
            )
            for i in range(n)
        ]

    def inventory(self) -> list[GpuInfo]:
        return [
            GpuInfo(
                uuid=g.uuid,
                index=g.index,
                name="Simulated NVIDIA H100 80GB HBM3",
                pci_bus_id=g.pci,
                memory_total_mib=MEM_TOTAL_MIB,
                power_limit_w=POWER_LIMIT_W,
                driver="simulated",
            )
            for g in self.gpus
        ]

    def sample(self, now: float) -> list[GpuSample]:
        # Asked outside the lock: the rank table has a lock of its own, and XID injection
        # (which takes ours) is called under it.
        busy = self.ranks_alive is None or bool(self.ranks_alive())
        with self._lock:
            if not busy:
                self._t0 = None  # the next job warms the GPUs up from idle
            elif self._t0 is None:
                self._t0 = now
            rebooted = [self._reboot(g, now) for g in self.gpus if self._reboot_due(g, now)]
            base = None if self._t0 is None else self._job_util(now - self._t0)
            samples = [self._step(g, now, base) for g in self.gpus]
        if self.outbox is not None:
            for event in rebooted:
                self.outbox.put_event(event, urgent=True)
        return samples

    def _reboot_due(self, g: _Gpu, now: float) -> bool:
        return g.lost and self.reboot_after_s is not None and now >= g.lost_at + self.reboot_after_s

    def _reboot(self, g: _Gpu, now: float) -> Event:
        """The simulated power cycle of a lost GPU: it is back, as after reset()."""
        down_s = now - g.lost_at
        self._reset(g)
        return Event(
            kind="log",
            ts=now,
            gpu_uuid=g.uuid,
            message=(
                f"simulated reboot: GPU {g.index} ({g.uuid}) is back on the bus "
                f"{down_s:.0f} s after it fell off (XID 79)"
            ),
            data={"simulated": True, "reboot": True, "index": g.index, "down_s": round(down_s, 1)},
        )

    def _job_util(self, t: float) -> float:
        """The job's utilisation at t seconds: warm-up, steady training, checkpoint dips."""
        if t < WARMUP_S:
            return 100.0 * max(t, 0.0) / WARMUP_S * 0.9
        if (t + self._phase) % CKPT_EVERY_S < CKPT_LEN_S:
            return 12.0
        return 97.0

    def _step(self, g: _Gpu, now: float, base: float | None) -> GpuSample:
        """One GPU's readings; base: the job's utilisation now, None while no job runs."""
        dt = 0.0 if g.last_ts is None else min(max(now - g.last_ts, 0.0), 60.0)
        g.last_ts = now
        if g.lost:
            return GpuSample(uuid=g.uuid, ts=now)  # every reading missing, as NVML gives
        rng = self._rng
        if now < g.idle_until:
            util = 0.0
        elif g.hung:
            util = 100.0  # a hung GPU spins whether or not a job still waits on it
        elif base is None:
            util = max(0.0, rng.gauss(0.3, 0.3))  # no job: the driver's background only
        else:
            util = min(100.0, max(0.0, base / g.slow**0.5 + rng.gauss(0, 1.5)))
        busy = util / 100.0
        power = IDLE_W + 50 if g.hung else IDLE_W + busy**1.2 * (POWER_LIMIT_W * 0.92 - IDLE_W)
        power = min(POWER_LIMIT_W, max(55.0, power + rng.gauss(0, 6)))
        target = 28.0 + power * 0.07
        g.temp += (target - g.temp) * (1 - math.exp(-dt / 20.0))
        thermal = g.temp > 83.0
        reasons = (GPU_IDLE if util < 5 else 0) | (SW_THERMAL if thermal else 0)
        if g.slow > 1.0:
            reasons |= HW_SLOWDOWN
        sm = 345.0 if util < 5 else (1755.0 if thermal else 1980.0) / g.slow
        g.energy_mj += power * dt * 1000.0
        # A job's memory fills as it warms up; an idle GPU holds only the driver's context.
        warm = 0.0 if self._t0 is None else min(1.0, (now - self._t0) / WARMUP_S)
        if rng.random() < 0.0005:
            g.pcie_replay += 1
        return GpuSample(
            uuid=g.uuid,
            ts=now,
            util=round(util, 1),
            mem_util=round(min(100.0, util * 0.45 + rng.uniform(0, 3)), 1),
            mem_used_mib=round(500 + warm * MEM_TOTAL_MIB * 0.82 + rng.uniform(-200, 200), 1),
            mem_total_mib=MEM_TOTAL_MIB,
            temp_c=round(g.temp, 1),
            mem_temp_c=round(g.temp + 6 + rng.uniform(0, 1), 1),
            power_w=round(power, 1),
            energy_mj=round(g.energy_mj),
            sm_clock_mhz=round(sm),
            mem_clock_mhz=2619.0,
            clock_event_reasons=reasons,
            ecc_sbe_volatile=g.ecc_sbe,
            ecc_dbe_volatile=g.ecc_dbe,
            remapped_correctable=g.remap_corr,
            remapped_uncorrectable=g.remap_unc,
            remap_pending=g.remap_pending,
            remap_failure=g.remap_failure,
            pcie_replay=g.pcie_replay,
        )

    def _gpu(self, index: int) -> _Gpu:
        if not 0 <= index < len(self.gpus):
            raise ValueError(f"no simulated GPU {index} (this node has {len(self.gpus)})")
        return self.gpus[index]

    def inject_xid(self, index: int, code: int, message: str = "") -> Event:
        """Inject an XID: change the GPU's state and put an urgent xid event in the outbox."""
        if not 0 <= code <= 100000:
            raise ValueError(f"XID must be between 0 and 100000, got {code}")
        now = self.clock()
        with self._lock:
            g = self._gpu(index)
            if code == 79 and not g.lost:
                # stays lost until a power cycle: the simulated reboot, or reset()
                g.lost, g.lost_at = True, now
            elif code == 48:
                g.ecc_dbe += 1
                g.remap_unc += 1
                g.remap_pending = True
            elif code == 63:
                g.remap_unc += 1
                g.remap_pending = True
            elif code == 64:
                g.remap_failure = True
            elif code == 92:
                g.ecc_sbe += 100
            elif code == 94:
                g.ecc_dbe += 1
            if code == 95:
                g.ecc_dbe += 1
            if code in _RESET_GPU:
                g.hung = True
            elif describe_xid(code).action == "RESTART_APP":
                g.idle_until = now + APP_RESTART_S
            pci = pci_key(g.pci)
        text = message or f"Xid {code}: {describe_xid(code).meaning} (injected)"
        event = xid_event(code, now, "injected", gpu_uuid=g.uuid, message=text, pci=pci)
        if self.outbox is not None:
            self.outbox.put_event(event, urgent=True)
        return event

    def reset(self, index: int) -> None:
        """A GPU reset: clears lost/hung, volatile ECC counts and pending remaps."""
        with self._lock:
            self._reset(self._gpu(index))

    @staticmethod
    def _reset(g: _Gpu) -> None:
        g.lost = g.hung = False
        g.idle_until = 0.0
        g.ecc_sbe = g.ecc_dbe = 0
        g.remap_pending = False

    def set_slow(self, index: int, factor: float) -> None:
        """Make a GPU a straggler: clocks and utilisation scaled down by `factor` (>= 1)."""
        if not 1.0 <= factor <= 100.0:
            raise ValueError(f"slow factor must be between 1 and 100, got {factor}")
        with self._lock:
            self._gpu(index).slow = factor

    def slow_factor(self, index: int) -> float:
        return self._gpu(index).slow

    def is_lost(self, index: int) -> bool:
        return self._gpu(index).lost

    def uuid_for_pci(self, pci: str) -> str | None:
        key = pci_key(pci)
        return next((g.uuid for g in self.gpus if key and pci_key(g.pci) == key), None)
