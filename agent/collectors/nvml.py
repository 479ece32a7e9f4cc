"""NVML, wrapped once (after nvitop's `libnvml`): lazy init under a lock, a per-call error
becomes a missing value, an init error becomes one `NvmlUnavailable` with a one-line reason.

`NvmlCollector` turns the raw calls into wire records (`GpuInfo`, `GpuSample`). Readings
outside the wire's bounds (NVML reports N/A as 0xFFFFFFFF on some boards) become missing,
so one odd reading never gets a whole batch refused.
"""

from __future__ import annotations

import logging
import threading
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from trainguard.protocol.wire import GpuInfo, GpuSample
from trainguard.worker import PYNVML_DEPRECATED

log = logging.getLogger(__name__)

MIB = 1024 * 1024
_COUNT_MAX = 2**63 - 1
_NA32 = 0xFFFFFFFF  # what several NVML counters hold when the value is not available


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine; str() is a one-line reason."""


def _import_pynvml() -> ModuleType:
    try:
        with warnings.catch_warnings():
            # The deprecated `pynvml` PyPI package may sit beside nvidia-ml-py and warn.
            warnings.filterwarnings("ignore", message=PYNVML_DEPRECATED, category=FutureWarning)
            import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(
            f"nvidia-ml-py is not installed ({exc}); install trainguard[agent]"
        ) from exc
    return pynvml


class Nvml:
    """One NVML session. `lib` is the pynvml module (injectable for tests)."""

    def __init__(self, module: ModuleType | None = None) -> None:
        self._module = module
        self._lock = threading.Lock()
        self._initialized = False
        self._logged: set[tuple[str, int]] = set()

    @property
    def lib(self) -> ModuleType:
        if self._module is None:
            self._module = _import_pynvml()
        return self._module

    def init(self) -> None:
        """Initialise NVML once; raises NvmlUnavailable with a one-line reason."""
        with self._lock:
            if self._initialized:
                return
            lib = self.lib
            try:
                lib.nvmlInit()
            except lib.NVMLError as exc:
                raise NvmlUnavailable(_one_line(exc)) from exc
            except OSError as exc:  # a broken libnvidia-ml.so can fail inside ctypes
                raise NvmlUnavailable(_one_line(exc)) from exc
            self._initialized = True

    def shutdown(self) -> None:
        with self._lock:
            if not self._initialized:
                return
            self._initialized = False
            try:
                self.lib.nvmlShutdown()
            except self.lib.NVMLError as exc:
                log.debug("nvmlShutdown: %s", _one_line(exc))

    def call(self, fn_name: str, *args: Any) -> Any:
        """Call an NVML function; NVMLError propagates (for callers that need the code)."""
        self.init()
        return getattr(self.lib, fn_name)(*args)

    def query(self, fn_name: str, *args: Any, default: Any = None) -> Any:
        """Call an NVML function; any per-call NVML error returns `default` (missing)."""
        self.init()
        lib = self.lib
        fn = getattr(lib, fn_name, None)
        if fn is None:  # an older nvidia-ml-py without this call
            self._log_once(fn_name, -1, "not in this nvidia-ml-py")
            return default
        try:
            return fn(*args)
        except lib.NVMLError as exc:
            self._log_once(fn_name, int(getattr(exc, "value", -1)), _one_line(exc))
            return default

    def error_code(self, exc: BaseException) -> int | None:
        """The NVML error code of `exc`, or None when it is no NVMLError."""
        if isinstance(exc, self.lib.NVMLError):
            return int(getattr(exc, "value", -1))
        return None

    def _log_once(self, fn_name: str, code: int, reason: str) -> None:
        if (fn_name, code) not in self._logged:
            self._logged.add((fn_name, code))
            log.debug("NVML %s: %s (reported as missing)", fn_name, reason)


def _one_line(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # NVMLError.__str__ may call into a library that is not there
        text = ""
    text = " ".join(text.split()) or type(exc).__name__
    return text


def _num(v: Any, lo: float = 0.0, hi: float = float("inf"), scale: float = 1.0) -> float | None:
    """A reading as float within [lo, hi] after scaling, else None (missing)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v) / scale
    except (TypeError, ValueError):
        return None
    return f if lo <= f <= hi else None


def _count(v: Any) -> int | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        n = int(v)
    except (TypeError, ValueError):
        return None
    return n if 0 <= n <= _COUNT_MAX else None


@dataclass(frozen=True)
class Device:
    index: int
    uuid: str
    handle: Any
    pci_bus_id: str


class NvmlCollector:
    """Reads inventory and samples from NVML; the same interface as SimulatedGpus."""

    simulated = False

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        nvml.init()
        self.devices: list[Device] = []
        self.unreadable: dict[int, str] = {}  # index -> reason, for GPUs lost at start
        count = int(nvml.call("nvmlDeviceGetCount"))
        for i in range(count):
            try:
                handle = nvml.call("nvmlDeviceGetHandleByIndex", i)
                uuid = str(nvml.call("nvmlDeviceGetUUID", handle))
            except nvml.lib.NVMLError as exc:
                self.unreadable[i] = _one_line(exc)
                log.warning("GPU %d is unreadable: %s", i, self.unreadable[i])
                continue
            pci = nvml.query("nvmlDeviceGetPciInfo", handle)
            bus_id = str(getattr(pci, "busId", "") or "") if pci is not None else ""
            self.devices.append(Device(i, uuid, handle, bus_id))

    def inventory(self) -> list[GpuInfo]:
        q = self.nvml.query
        driver = q("nvmlSystemGetDriverVersion", default="")
        out = []
        for d in self.devices:
            mem = q("nvmlDeviceGetMemoryInfo", d.handle)
            limit = q("nvmlDeviceGetEnforcedPowerLimit", d.handle)
            out.append(
                GpuInfo(
                    uuid=d.uuid,
                    index=d.index,
                    name=str(q("nvmlDeviceGetName", d.handle, default=""))[:256],
                    pci_bus_id=d.pci_bus_id[:256],
                    memory_total_mib=_num(getattr(mem, "total", None), scale=MIB),
                    power_limit_w=_num(limit, hi=_NA32 / 1000 - 1, scale=1000.0),
                    driver=str(driver)[:256],
                )
            )
        return out

    def sample(self, now: float) -> list[GpuSample]:
        return [self._sample_one(d, now) for d in self.devices]

    def _sample_one(self, d: Device, now: float) -> GpuSample:
        lib, q, h = self.nvml.lib, self.nvml.query, d.handle
        util = q("nvmlDeviceGetUtilizationRates", h)
        mem = q("nvmlDeviceGetMemoryInfo", h)
        rows = q("nvmlDeviceGetRemappedRows", h)
        corr = unc = pending = failure = None
        if rows is not None:
            corr, unc, pending, failure = rows
        return GpuSample(
            uuid=d.uuid,
            ts=now,
            util=_num(getattr(util, "gpu", None), hi=100),
            mem_util=_num(getattr(util, "memory", None), hi=100),
            mem_used_mib=_num(getattr(mem, "used", None), scale=MIB),
            mem_total_mib=_num(getattr(mem, "total", None), scale=MIB),
            temp_c=_num(q("nvmlDeviceGetTemperature", h, lib.NVML_TEMPERATURE_GPU), -50, 200),
            mem_temp_c=_num(self._field(h, lib.NVML_FI_DEV_MEMORY_TEMP), -50, 200),
            power_w=_num(q("nvmlDeviceGetPowerUsage", h), hi=_NA32 / 1000 - 1, scale=1000.0),
            energy_mj=_num(q("nvmlDeviceGetTotalEnergyConsumption", h), hi=float(_COUNT_MAX)),
            sm_clock_mhz=_num(q("nvmlDeviceGetClockInfo", h, lib.NVML_CLOCK_SM), hi=_NA32 - 1),
            mem_clock_mhz=_num(q("nvmlDeviceGetClockInfo", h, lib.NVML_CLOCK_MEM), hi=_NA32 - 1),
            clock_event_reasons=_count(q("nvmlDeviceGetCurrentClocksEventReasons", h)),
            ecc_sbe_volatile=_count(self._ecc(h, lib.NVML_MEMORY_ERROR_TYPE_CORRECTED)),
            ecc_dbe_volatile=_count(self._ecc(h, lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)),
            remapped_correctable=_count(corr),
            remapped_uncorrectable=_count(unc),
            remap_pending=None if pending is None else bool(pending),
            remap_failure=None if failure is None else bool(failure),
            pcie_replay=_count(q("nvmlDeviceGetPcieReplayCounter", h)),
        )

    def _ecc(self, h: Any, error_type: int) -> Any:
        lib = self.nvml.lib
        return self.nvml.query("nvmlDeviceGetTotalEccErrors", h, error_type, lib.NVML_VOLATILE_ECC)

    def _field(self, h: Any, field_id: int) -> float | int | None:
        """One nvmlDeviceGetFieldValues value; None when the field is not supported."""
        values = self.nvml.query("nvmlDeviceGetFieldValues", h, [field_id])
        if not values:
            return None
        fv = values[0]
        if getattr(fv, "nvmlReturn", 1) != 0:
            return None
        lib = self.nvml.lib
        member = {
            lib.NVML_VALUE_TYPE_DOUBLE: "dVal",
            lib.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
            lib.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
            lib.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
            lib.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
            lib.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        }.get(getattr(fv, "valueType", -1))
        if member is None:
            return None
        value: float | int | None = getattr(fv.value, member, None)
        return value

    def uuid_for_pci(self, pci: str) -> str | None:
        """The uuid of the GPU at a PCI address in any common spelling, or None."""
        key = pci_key(pci)
        for d in self.devices:
            if key is not None and pci_key(d.pci_bus_id) == key:
                return d.uuid
        return None


def pci_key(pci: str) -> str | None:
    """Normalise `00000000:18:00.0`, `0000:18:00`, `18:00.0` to `0000:18:00`."""
    parts = pci.strip().lower().split(".")[0].split(":")
    try:
        if len(parts) == 3:
            domain, bus, dev = (int(p, 16) for p in parts)
        elif len(parts) == 2:
            domain, (bus, dev) = 0, (int(p, 16) for p in parts)
        else:
            return None
    except ValueError:
        return None
    return f"{domain:04x}:{bus:02x}:{dev:02x}"
