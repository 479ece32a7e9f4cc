"""Shared fakes for the agent tests: a stand-in for the pynvml module (the hardware
boundary only; its errors, constants and field-value structs are the real nvidia-ml-py
ones) and a deadline-based wait."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    import pynvml

from trainguard.protocol.wire import Event


def _wait_for(cond: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
    """Poll `cond` until it is truthy; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


class FakeHandle:
    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<handle {self.index}>"


class FakePynvml:
    """Enough of pynvml for NvmlCollector and XidWatcher. `fail[fn_name]` is an NVMLError
    (class or instance) raised by that call, or a callable(handle) -> exception | None."""

    def __init__(self, n: int = 2) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType", "NVMLError")):
                setattr(self, name, getattr(pynvml, name))
        self.c_nvmlFieldValue_t = pynvml.c_nvmlFieldValue_t
        self.handles = [FakeHandle(i) for i in range(n)]
        self.fail: dict[str, Any] = {}
        self.values: dict[str, Any] = {}
        self.init_error: BaseException | None = None
        self.init_calls = 0
        self.events: queue.Queue[Any] = queue.Queue()
        self.registered: list[tuple[FakeHandle, int]] = []
        self.supported = (
            pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeSingleBitEccError
        )
        self._lock = threading.Lock()

    def _check(self, name: str, handle: Any = None) -> None:
        err = self.fail.get(name)
        if err is None:
            return
        if callable(err) and not isinstance(err, type):
            err = err(handle)
            if err is None:
                return
        raise err() if isinstance(err, type) else err

    def _val(self, name: str, handle: FakeHandle, default: Any) -> Any:
        self._check(name, handle)
        v = self.values.get(name, default)
        return v(handle) if callable(v) else v

    # --- init / devices --------------------------------------------------------------
    def nvmlInit(self) -> None:
        with self._lock:
            self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.90.07"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.handles)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeHandle:
        self._check("nvmlDeviceGetHandleByIndex", i)
        return self.handles[i]

    def nvmlDeviceGetUUID(self, h: FakeHandle) -> str:
        self._check("nvmlDeviceGetUUID", h)
        return f"GPU-fake-{h.index}"

    def nvmlDeviceGetName(self, h: FakeHandle) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetPciInfo(self, h: FakeHandle) -> Any:
        return SimpleNamespace(busId=f"00000000:{0x18 + h.index:02X}:00.0")

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeHandle) -> int:
        return self._val("nvmlDeviceGetEnforcedPowerLimit", h, 700_000)

    # --- readings ----------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h: FakeHandle) -> Any:
        return self._val("nvmlDeviceGetUtilizationRates", h, SimpleNamespace(gpu=87, memory=41))

    def nvmlDeviceGetMemoryInfo(self, h: FakeHandle, version: Any = None) -> Any:
        mib = 1024 * 1024
        default = SimpleNamespace(total=81559 * mib, used=40000 * mib, free=41559 * mib)
        return self._val("nvmlDeviceGetMemoryInfo", h, default)

    def nvmlDeviceGetTemperature(self, h: FakeHandle, sensor: int) -> int:
        return self._val("nvmlDeviceGetTemperature", h, 64)

    def nvmlDeviceGetFieldValues(self, h: FakeHandle, field_ids: list[int]) -> Any:
        self._check("nvmlDeviceGetFieldValues", h)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for i, fid in enumerate(field_ids):
            values[i].fieldId = fid
            values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            mem_temp = self.values.get("mem_temp", 71)
            if mem_temp is None:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                values[i].nvmlReturn = pynvml.NVML_SUCCESS
                values[i].value.uiVal = mem_temp
        return values

    def nvmlDeviceGetPowerUsage(self, h: FakeHandle) -> int:
        return self._val("nvmlDeviceGetPowerUsage", h, 612_345)

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeHandle) -> int:
        return self._val("nvmlDeviceGetTotalEnergyConsumption", h, 5_000_000_000)

    def nvmlDeviceGetClockInfo(self, h: FakeHandle, kind: int) -> int:
        self._check("nvmlDeviceGetClockInfo", h)
        return 1980 if kind == pynvml.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeHandle) -> int:
        return self._val("nvmlDeviceGetCurrentClocksEventReasons", h, 0x20)

    def nvmlDeviceGetTotalEccErrors(self, h: FakeHandle, error_type: int, counter: int) -> int:
        self._check("nvmlDeviceGetTotalEccErrors", h)
        assert counter == pynvml.NVML_VOLATILE_ECC
        return 3 if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 1

    def nvmlDeviceGetRemappedRows(self, h: FakeHandle) -> tuple[int, int, int, int]:
        return self._val("nvmlDeviceGetRemappedRows", h, (2, 1, 1, 0))

    def nvmlDeviceGetPcieReplayCounter(self, h: FakeHandle) -> int:
        return self._val("nvmlDeviceGetPcieReplayCounter", h, 7)

    # --- events ------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> object:
        self._check("nvmlEventSetCreate")
        return object()

    def nvmlDeviceGetSupportedEventTypes(self, h: FakeHandle) -> int:
        return self._val("nvmlDeviceGetSupportedEventTypes", h, self.supported)

    def nvmlDeviceRegisterEvents(self, h: FakeHandle, mask: int, event_set: object) -> None:
        self._check("nvmlDeviceRegisterEvents", h)
        self.registered.append((h, mask))

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        try:
            item = self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError_Timeout() from None
        if isinstance(item, BaseException):
            raise item
        return item

    def nvmlEventSetFree(self, event_set: object) -> None:
        pass

    def xid(self, index: int, xid: int) -> None:
        """Queue one XID event on GPU `index`, as the driver would deliver it."""
        self.events.put(
            SimpleNamespace(
                device=self.handles[index],
                eventType=pynvml.nvmlEventTypeXidCriticalError,
                eventData=xid,
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )
        )


@pytest.fixture
def fake_pynvml() -> FakePynvml:
    return FakePynvml()


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    return _wait_for


class Outbox:
    """The rank table's outbox: the events it put, in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def put_event(self, event: Event, urgent: bool = False) -> None:
        self.events.append(event)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A real process that lives for the test: a rank's or a launcher's pid."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p
    p.kill()
    p.wait()
