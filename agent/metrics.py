"""The agent's Prometheus exporter: `/metrics` on the node, next to (or instead of)
dcgm-exporter.

`AgentExporter(agent, port)` is an agent component (start/stop). It serves

- GPU readings under dcgm-exporter's names and labels (`DCGM_FI_DEV_GPU_UTIL{gpu="0",
  UUID="GPU-...",device="nvidia0",modelName=...,pci_bus_id=...,Hostname=...}`), so
  dashboards and alerts written for dcgm-exporter work unchanged. Every DCGM field is a
  gauge here, the cumulative ones included (rate() does not care); dcgm-exporter's
  TYPE line says counter for those, which prometheus-client cannot write without a
  `_total` suffix that would change the name. GPUs of the simulated source carry the
  extra label `simulated="true"` (real GPUs have exactly dcgm-exporter's labels);
- XID errors counted by code (`trainguard_agent_xid_errors_total`) and the last one per
  GPU (`DCGM_FI_DEV_XID_ERRORS`, as dcgm-exporter);
- the age of each training rank's last heartbeat and its last step, from the SDK server;
- the uplink's counters (batches sent, spooled, replayed, rejected; backlog; clock offset);
- the warm worker pool's interpreters (idle, busy), memory (RSS, PSS) and counters.

The readings are the ones the agent already takes every `interval` for the backend: the
exporter keeps the last sample of each GPU as it passes through the outbox, so a scrape
never calls NVML and never changes what the backend receives. XIDs are counted the same
way, after the watchers' de-duplication. prometheus-client is imported at start(), so an
agent without the exporter does not need it.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from trainguard.protocol.wire import Event, GpuInfo, GpuSample

# (wire field, dcgm-exporter name, help) -- the names of etc/default-counters.csv and,
# for the ECC counters, of its commented-out lines.
DCGM_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("sm_clock_mhz", "DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
    ("mem_clock_mhz", "DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz)."),
    ("mem_temp_c", "DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C)."),
    ("temp_c", "DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    ("power_w", "DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    (
        "energy_mj",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
    ),
    ("pcie_replay", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries."),
    ("util", "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("mem_util", "DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %)."),
    ("mem_used_mib", "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    (
        "ecc_sbe_volatile",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors.",
    ),
    (
        "ecc_dbe_volatile",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
    ),
    (
        "remapped_uncorrectable",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors",
    ),
    (
        "remapped_correctable",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors",
    ),
    ("remap_failure", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed"),
    (
        "clock_event_reasons",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "Current clock event reasons (bitmask of NVML clocks event reasons).",
    ),
)
GPU_LABELS = ("gpu", "UUID", "device", "modelName", "pci_bus_id", "Hostname")
DEFAULT_PORT = 9401  # dcgm-exporter's is 9400: both can run on one node


class AgentReadings:
    """What the exporter serves, kept as it passes through the agent's outbox.

    `attach(outbox)` wraps the outbox's `put_samples`, `put_event` and `set_gpus` on that
    one instance (every producer calls them through it), and `detach()` puts them back.
    The wrappers forward first and record after, so the agent's own path is unchanged.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.gpus: dict[str, GpuInfo] = {}
        self.last: dict[str, GpuSample] = {}
        self.xids: Counter[tuple[str, int]] = Counter()  # (uuid or "", xid) -> count
        self.last_xid: dict[str, int] = {}
        self.events: Counter[str] = Counter()
        self._outbox: Any = None
        self._originals: dict[str, Any] = {}

    def attach(self, outbox: Any) -> None:
        if self._outbox is not None:
            raise RuntimeError("already attached to an outbox")
        self._outbox = outbox
        for name, record in (
            ("put_samples", self.on_samples),
            ("put_event", self.on_event),
            ("set_gpus", self.on_gpus),
        ):
            original = getattr(outbox, name)
            self._originals[name] = original
            setattr(outbox, name, _forward_then(original, record))

    def detach(self) -> None:
        if self._outbox is None:
            return
        for name in self._originals:
            vars(self._outbox).pop(name, None)  # the class's method shows through again
        self._originals.clear()
        self._outbox = None

    def on_samples(self, samples: list[GpuSample], *_: Any, **__: Any) -> None:
        with self._lock:
            for s in samples:
                self.last[s.uuid] = s

    def on_gpus(self, gpus: list[GpuInfo], *_: Any, **__: Any) -> None:
        with self._lock:
            self.gpus = {g.uuid: g for g in gpus}
            self.last = {u: s for u, s in self.last.items() if u in self.gpus}

    def on_event(self, event: Event, *_: Any, **__: Any) -> None:
        with self._lock:
            self.events[event.kind] += 1
            if event.kind == "xid" and event.xid is not None:
                self.xids[(event.gpu_uuid or "", event.xid)] += 1
                if event.gpu_uuid:
                    self.last_xid[event.gpu_uuid] = event.xid

    def snapshot(self) -> tuple[dict[str, GpuInfo], dict[str, GpuSample], dict[str, Any]]:
        with self._lock:
            return (
                dict(self.gpus),
                dict(self.last),
                {
                    "xids": Counter(self.xids),
                    "last_xid": dict(self.last_xid),
                    "events": Counter(self.events),
                },
            )


def _forward_then(original: Callable[..., Any], record: Callable[..., None]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        # The exporter must never break the agent's data path.
        with contextlib.suppress(Exception):
            record(*args, **kwargs)
        return out

    return wrapper


class AgentCollector:
    """A prometheus-client collector over one agent's readings, rank table and uplink."""

    def __init__(self, agent: Any, readings: AgentReadings, hostname: str) -> None:
        self.agent = agent
        self.readings = readings
        self.hostname = hostname

    def _local_server(self) -> Any:
        for c in getattr(self.agent, "components", ()):
            if callable(getattr(c, "rank_statuses", None)):
                return c
        return None

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        gpus, last, extra = self.readings.snapshot()
        simulated = bool(getattr(self.agent.source, "simulated", False))
        sim_label = ["simulated"] if simulated else []

        def gpu_labels(uuid: str) -> list[str]:
            info = gpus.get(uuid)
            index = str(info.index) if info is not None else ""
            values = [
                index,
                uuid,
                f"nvidia{index}" if index else "",
                info.name if info is not None else "",
                info.pci_bus_id if info is not None else "",
                self.hostname,
            ]
            return values + (["true"] if simulated else [])

        labels = [*GPU_LABELS, *sim_label]
        for field, name, help_ in DCGM_FIELDS:
            fam = GaugeMetricFamily(name, help_, labels=labels)
            for uuid, s in sorted(last.items()):
                v = getattr(s, field)
                if v is not None:
                    fam.add_metric(gpu_labels(uuid), float(v))
            yield fam
        free = GaugeMetricFamily(
            "DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=labels
        )
        for uuid, s in sorted(last.items()):
            if s.mem_total_mib is not None and s.mem_used_mib is not None:
                free.add_metric(gpu_labels(uuid), max(0.0, s.mem_total_mib - s.mem_used_mib))
        yield free
        last_xid = GaugeMetricFamily(
            "DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", labels=labels
        )
        for uuid in sorted(gpus):
            last_xid.add_metric(gpu_labels(uuid), float(extra["last_xid"].get(uuid, 0)))
        yield last_xid
        sample_ts = GaugeMetricFamily(
            "trainguard_agent_gpu_sample_timestamp_seconds",
            "when the agent last read this GPU (Unix time)",
            labels=labels,
        )
        for uuid, s in sorted(last.items()):
            sample_ts.add_metric(gpu_labels(uuid), s.ts)
        yield sample_ts

        xids = CounterMetricFamily(
            "trainguard_agent_xid_errors",
            "XID errors reported by this agent (after de-duplication), by code",
            labels=["Hostname", "UUID", "xid"],
        )
        for (uuid, code), n in sorted(extra["xids"].items()):
            xids.add_metric([self.hostname, uuid, str(code)], n)
        yield xids
        events = CounterMetricFamily(
            "trainguard_agent_events",
            "events the agent reported, by kind",
            labels=["Hostname", "kind"],
        )
        for kind, n in sorted(extra["events"].items()):
            events.add_metric([self.hostname, kind], n)
        yield events

        yield from self._ranks()
        yield from self._uplink()
        yield from self._pool()

    def _pool(self) -> Iterator[Any]:
        """The warm worker pool (agent/worker/): its interpreters and their memory."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        pools = [c for c in getattr(self.agent, "components", ()) if hasattr(c, "pool_socket")]
        st = pools[0].stats() if pools else None
        if st is None:
            return
        host = [self.hostname]
        for name, help_, value in (
            ("idle", "warm interpreters ready for a worker", len(st.get("idle", []))),
            ("busy", "workers running in interpreters of the pool", len(st.get("busy", []))),
            ("size", "warm interpreters the pool keeps", st.get("size", 0)),
            (
                "rss_bytes",
                "resident memory of the pool process and its idle interpreters (shared "
                "pages counted in each)",
                st.get("rss_bytes", 0),
            ),
            (
                "pss_bytes",
                "proportional set size of the pool process and its idle interpreters",
                st.get("pss_bytes", 0),
            ),
        ):
            g = GaugeMetricFamily(
                f"trainguard_agent_worker_pool_{name}", help_, labels=["Hostname"]
            )
            g.add_metric(host, float(value))
            yield g
        for name, help_, value in (
            ("served", "workers started warm", st.get("served", 0)),
            (
                "busy_answers",
                "requests answered busy (the worker ran cold)",
                st.get("busy_answers", 0),
            ),
            (
                "cpu_seconds",
                "CPU time of the pool process and its idle interpreters",
                st.get("cpu_s", 0.0),
            ),
        ):
            c = CounterMetricFamily(
                f"trainguard_agent_worker_pool_{name}", help_, labels=["Hostname"]
            )
            c.add_metric(host, float(value))
            yield c

    def _ranks(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        labels = ["Hostname", "job", "rank", "local_rank"]
        age = GaugeMetricFamily(
            "trainguard_agent_rank_heartbeat_age_seconds",
            "seconds since each training rank on this node last heartbeated",
            labels=labels,
        )
        step = GaugeMetricFamily(
            "trainguard_agent_rank_last_step", "last completed step of each rank", labels=labels
        )
        alive = GaugeMetricFamily(
            "trainguard_agent_rank_alive", "1 while the rank's process is alive", labels=labels
        )
        local = self._local_server()
        now = self.readings.clock()
        for r in local.rank_statuses() if local is not None else ():
            lv = [self.hostname, r.job, str(r.rank), str(r.local_rank)]
            alive.add_metric(lv, 1.0 if r.alive else 0.0)
            if r.last_heartbeat is not None:
                age.add_metric(lv, max(0.0, now - r.last_heartbeat))
            if r.last_step is not None:
                step.add_metric(lv, float(r.last_step))
        yield age
        yield step
        yield alive

    def _uplink(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        uplink = getattr(self.agent, "uplink", None)
        if uplink is None:
            return
        st = uplink.stats()
        host = [self.hostname]
        for key, help_ in (
            ("batches_sent", "batches the backend stored"),
            ("samples_sent", "GPU samples delivered"),
            ("events_sent", "events delivered"),
            ("steps_sent", "step reports delivered"),
            ("duplicates", "batches the backend already had (replays)"),
            ("batches_spooled", "batches written to the on-disk spool"),
            ("batches_merged", "batches of an outage spooled into the newest unsent one"),
            ("batches_replayed", "spooled batches delivered later"),
            ("batches_rejected", "batches the backend refused for good (4xx)"),
            ("records_invalid", "records dropped because they failed the wire's validation"),
            ("records_dropped", "records dropped by outbox or spool overflow"),
        ):
            c = CounterMetricFamily(f"trainguard_agent_uplink_{key}", help_, labels=["Hostname"])
            c.add_metric(host, float(getattr(st, key)))
            yield c
        for name, help_, value in (
            ("backlog_batches", "batches waiting in the spool", st.backlog),
            ("connected", "1 when the last delivery to the backend succeeded", st.connected),
            ("last_sent_timestamp_seconds", "when a batch was last delivered", st.last_sent_at),
            (
                "clock_offset_seconds",
                "backend clock minus this node's (positive: the node is behind)",
                st.clock_offset_s,
            ),
        ):
            if value is None:
                continue
            g = GaugeMetricFamily(f"trainguard_agent_uplink_{name}", help_, labels=["Hostname"])
            g.add_metric(host, float(value))
            yield g
        info = GaugeMetricFamily(
            "trainguard_agent_info",
            "the agent on this node (value 1)",
            labels=["Hostname", "version", "source", "agent_id"],
        )
        source = "simulated" if getattr(self.agent.source, "simulated", False) else "nvml"
        from trainguard.agent.uplink.sender import agent_version

        info.add_metric([self.hostname, agent_version(), source, uplink.agent_id], 1.0)
        yield info


class AgentExporter:
    """Agent component: a Prometheus endpoint on `host:port` (port 0: any free port,
    then `self.port` says which)."""

    def __init__(self, agent: Any, port: int = DEFAULT_PORT, host: str = "0.0.0.0") -> None:
        self.agent = agent
        self.host = host
        self.port = port
        self.readings = AgentReadings()
        node = getattr(getattr(agent, "config", None), "node", None)
        self.collector = AgentCollector(agent, self.readings, node or socket.gethostname())
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError as exc:
            raise RuntimeError(
                "the metrics exporter needs prometheus-client: pip install 'trainguard[agent]'"
            ) from exc
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.collector)
        self.readings.attach(self.agent.outbox)
        try:
            self._server, self._thread = start_http_server(self.port, self.host, registry)
        except OSError as exc:
            self.readings.detach()
            raise RuntimeError(f"metrics port {self.host}:{self.port}: {exc.strerror}") from exc
        self.port = int(self._server.server_address[1])
        # The agent put its inventory into the outbox before components start.
        inventory = getattr(self.agent.source, "inventory", None)
        if callable(inventory):
            with contextlib.suppress(Exception):  # the next inventory refresh fills it
                self.readings.on_gpus(inventory())

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        self.readings.detach()
