"""The node agent process: a GPU source, XID watchers, the uplink and added components.

`build_agent(cfg)` chooses the source (NVML, or simulated GPUs when asked) and fails with
one line when neither is possible; `Agent.run()` samples every `interval` on a monotonic
clock until SIGINT/SIGTERM, then stops everything and flushes the outbox once (what
cannot be sent goes to the spool). It logs one line once everything has started (server,
node, SDK socket, collectors) and one when a batch first reaches the backend.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

import httpx

from trainguard.agent.collectors.nvml import Nvml, NvmlCollector, NvmlUnavailable
from trainguard.agent.collectors.simulated import SimulatedGpus
from trainguard.agent.collectors.xid_watchers import KmsgWatcher, XidDedup, XidWatcher
from trainguard.agent.config import AgentConfig
from trainguard.agent.uplink.outbox import Outbox
from trainguard.agent.uplink.sender import Uplink, agent_version
from trainguard.agent.uplink.spool import Spool, SpoolLocked
from trainguard.protocol.payloads import AgentStartData, GpuLostData
from trainguard.protocol.wire import Event, GpuInfo, GpuSample

log = logging.getLogger(__name__)


class GpuSource(Protocol):
    simulated: bool

    def inventory(self) -> list[GpuInfo]: ...
    def sample(self, now: float) -> list[GpuSample]: ...
    def uuid_for_pci(self, pci: str) -> str | None: ...


class Component(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


class AgentSetupError(RuntimeError):
    """The agent cannot start; str() is the one line to print."""


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        source: GpuSource,
        outbox: Outbox | None = None,
        uplink: Uplink | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        spool: Spool | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.outbox = outbox if outbox is not None else Outbox()
        self.source = source
        self.simulated: SimulatedGpus | None = None
        if isinstance(source, SimulatedGpus):
            self.simulated = source
            if source.outbox is None:
                source.outbox = self.outbox
            if source.ranks_alive is None:
                source.ranks_alive = self.ranks_alive  # idle GPUs while no job runs here
        self.uplink = uplink or Uplink(config, self.outbox, transport=transport, spool=spool)
        self.clock, self.monotonic = clock, monotonic
        self.dedup = XidDedup()
        self.watchers: list[Component] = self._watchers()
        self.components: list[Component] = []
        self.samples_taken = 0
        self._stop = threading.Event()
        self._sample_errors = 0

    def _watchers(self) -> list[Component]:
        out: list[Component] = []
        src = self.source
        if isinstance(src, NvmlCollector):
            out.append(XidWatcher(src.nvml, src.devices, self.outbox, self.dedup, self.clock))
        kmsg = self.config.kmsg_path
        # Simulated GPUs read a kernel log only when one is named explicitly (a test file).
        if kmsg is not None and (not src.simulated or "kmsg_path" in self.config.model_fields_set):
            out.append(KmsgWatcher(kmsg, self.outbox, src.uuid_for_pci, self.dedup, self.clock))
        return out

    def ranks_alive(self) -> bool:
        """Whether a training rank is alive on this node: in the rank table of a component
        that keeps one (the SDK socket server's `ranks` by pid, read under its `cond`)."""
        for c in self.components:
            ranks, cond = getattr(c, "ranks", None), getattr(c, "cond", None)
            if not isinstance(ranks, dict) or cond is None:
                continue
            with cond:
                if any(getattr(r, "alive", False) for r in ranks.values()):
                    return True
        return False

    def add_component(self, obj: Component) -> None:
        """Something with start()/stop() that lives as long as the agent (SDK server ...)."""
        self.components.append(obj)

    def stop(self, reason: str = "the agent is stopping") -> None:
        """Ask run() to return (thread-safe; also what SIGINT/SIGTERM do). Its last batch
        tells the backend that it is going away, and why."""
        if not self._stop.is_set():
            self.uplink.going_away = reason
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> int:
        """Start everything, sample until stopped, stop everything; the exit code."""
        restore = self._install_signals()
        started: list[Component] = []
        code = 0
        try:
            inventory = self.source.inventory()
            self.outbox.set_gpus(inventory)
            self._emit_start()
            self.uplink.start()
            for c in [*self.watchers, *self.components]:
                try:
                    c.start()
                except Exception as exc:
                    log.error("cannot start %s: %s", type(c).__name__, exc)
                    code = 1
                    break
                started.append(c)
            else:
                log.info("%s", self.describe(started, len(inventory)))
                self._sample_loop()
        finally:
            for c in reversed(started):
                try:
                    c.stop()
                except Exception:
                    log.exception("stopping %s failed", type(c).__name__)
            self.uplink.stop()
            if isinstance(self.source, NvmlCollector):
                self.source.nvml.shutdown()
            restore()
        st = self.uplink.stats()
        log.info(
            "agent stopped: %d batches sent, %d spooled for later", st.batches_sent, st.backlog
        )
        return code

    def describe(self, components: list[Component], gpus: int) -> str:
        """The start line: version, node, server, the SDK socket, what it collects."""
        cfg = self.config
        parts = [f"trainguard agent {agent_version()} started: node {cfg.node}"]
        parts.append(f"server {cfg.server}")
        sockets = [str(c.socket_path) for c in components if hasattr(c, "socket_path")]
        parts.append(f"socket {', '.join(sockets) or 'none (no SDK server)'}")
        collectors = [f"{'simulated' if self.source.simulated else 'NVML'} GPUs x{gpus}"]
        for w in self.watchers:
            if isinstance(w, XidWatcher):
                collectors.append("XID events (NVML)")
            elif isinstance(w, KmsgWatcher):
                collectors.append(f"XIDs from {cfg.kmsg_path}")
        parts.append(f"collectors: {', '.join(collectors)}")
        if cfg.store_port:
            parts.append(f"store {cfg.store_host}:{cfg.store_port}")
        if cfg.metrics_port is not None:
            parts.append(f"metrics {cfg.metrics_host}:{cfg.metrics_port}")
        for c in components:
            if hasattr(c, "pool_socket"):
                parts.append(f"worker pool x{cfg.pool} on {c.pool_socket}")
        return "; ".join(parts)

    def _emit_start(self) -> None:
        src = "simulated" if self.source.simulated else "nvml"
        self.outbox.put_event(
            Event(
                kind="agent_start",
                ts=self.clock(),
                message=f"trainguard agent {agent_version()} started ({src} GPUs)",
                data=AgentStartData(
                    version=agent_version(),
                    source=src,
                    agent_id=self.uplink.agent_id,
                    pid=os.getpid(),
                    interval=self.config.interval,
                ).wire(),
            ),
            urgent=True,
        )
        for index, reason in getattr(self.source, "unreadable", {}).items():
            self.outbox.put_event(
                Event(
                    kind="gpu_lost",
                    ts=self.clock(),
                    message=f"GPU {index} unreadable at agent start: {reason}",
                    data=GpuLostData(index=index, reason=reason[:256]).wire(),
                ),
                urgent=True,
            )

    def _sample_loop(self) -> None:
        interval = self.config.interval
        next_t = self.monotonic()
        last_inventory = next_t
        reached = False
        while not self._stop.is_set():
            self.sample_once()
            if not reached and self.uplink.stats().batches_sent:
                reached = True
                log.info("reached the backend at %s", self.config.server)
            if self.monotonic() - last_inventory >= self.config.inventory_every_s:
                last_inventory = self.monotonic()
                self._refresh_inventory()
            next_t += interval
            now = self.monotonic()
            if next_t < now - interval:  # fell far behind (suspended?): skip, no burst
                next_t = now
            self._stop.wait(max(0.0, next_t - now))

    def sample_once(self) -> None:
        try:
            self.outbox.put_samples(self.source.sample(self.clock()))
            self.samples_taken += 1
        except Exception:
            self._sample_errors += 1
            if self._sample_errors in (1, 10, 100) or self._sample_errors % 1000 == 0:
                log.exception("sampling failed (%d times so far)", self._sample_errors)

    def _refresh_inventory(self) -> None:
        try:
            self.outbox.set_gpus(self.source.inventory())
        except Exception:
            log.exception("inventory failed")

    def _install_signals(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

        def handler(signum: int, frame: FrameType | None) -> None:
            if self._stop.is_set():  # asked twice: give up on the graceful flush
                os._exit(128 + signum)
            name = signal.Signals(signum).name
            log.info("%s received; stopping", name)
            self.stop(f"{name}: the agent is stopping")

        for s in previous:
            signal.signal(s, handler)

        def restore() -> None:
            for s, h in previous.items():
                signal.signal(s, h)

        return restore


def build_agent(cfg: AgentConfig, transport: httpx.BaseTransport | None = None) -> Agent:
    """The agent for this node; AgentSetupError (one line) when it cannot run."""
    outbox = Outbox()
    source: GpuSource
    nvml: Nvml | None = None
    if cfg.simulate:
        source = SimulatedGpus(cfg.simulate, cfg.node, cfg.seed, outbox)
    else:
        nvml = Nvml()
        source = _nvml_source(nvml)
    try:
        spool = Spool(cfg.spool_dir, cfg.spool_max_bytes)
    except SpoolLocked as exc:
        raise AgentSetupError(str(exc)) from exc
    except OSError as exc:
        raise AgentSetupError(f"cannot use spool {cfg.spool_dir}: {exc.strerror or exc}") from exc
    return Agent(cfg, source, outbox, transport=transport, spool=spool)


def _nvml_source(nvml: Nvml) -> NvmlCollector:
    hint = "use --simulate N for simulated GPUs"
    try:
        collector = NvmlCollector(nvml)
    except NvmlUnavailable as exc:
        raise AgentSetupError(f"no NVIDIA driver found (NVML: {exc}); {hint}") from exc
    except Exception as exc:
        if nvml.error_code(exc) is None:
            raise
        raise AgentSetupError(f"NVML cannot list GPUs ({exc}); {hint}") from exc
    if not collector.devices and not collector.unreadable:
        nvml.shutdown()
        raise AgentSetupError(f"NVML sees no GPU on this node; {hint}")
    return collector


def main(cfg: AgentConfig, setup: Callable[[Agent], Any] | None = None) -> int:
    """Run the agent until SIGINT/SIGTERM; `setup` may add components before it starts."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    try:
        agent = build_agent(cfg)
    except AgentSetupError as exc:
        print(f"trainguard agent: {exc}", file=sys.stderr)
        return 2
    if setup is not None:
        setup(agent)
    return agent.run()
