from __future__ import annotations

import threading
import warnings

import msgspec
import pytest

from trainguard.agent.collectors.nvml import Nvml, NvmlCollector, NvmlUnavailable, pci_key
from trainguard.protocol.wire import GpuSample, encode

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    import pynvml

MIB = 1024 * 1024


def valid_on_the_wire(sample: GpuSample) -> GpuSample:
    return msgspec.json.decode(encode(sample), type=GpuSample)


def test_every_reading_is_read_and_converted(fake_pynvml):
    s = NvmlCollector(Nvml(fake_pynvml)).sample(1_700_000_000.0)[0]
    assert s.uuid == "GPU-fake-0" and s.ts == 1_700_000_000.0
    assert (s.util, s.mem_util) == (87, 41)
    assert (s.mem_used_mib, s.mem_total_mib) == (40000, 81559)
    assert (s.temp_c, s.mem_temp_c) == (64, 71)
    assert s.power_w == pytest.approx(612.345)
    assert s.energy_mj == 5_000_000_000
    assert (s.sm_clock_mhz, s.mem_clock_mhz) == (1980, 2619)
    assert s.clock_event_reasons == 0x20
    assert (s.ecc_sbe_volatile, s.ecc_dbe_volatile) == (3, 1)
    assert (s.remapped_correctable, s.remapped_uncorrectable) == (2, 1)
    assert (s.remap_pending, s.remap_failure) == (True, False)
    assert s.pcie_replay == 7
    valid_on_the_wire(s)


def test_an_nvml_error_on_one_call_is_a_missing_value_not_a_crash(fake_pynvml):
    fake_pynvml.fail["nvmlDeviceGetPowerUsage"] = pynvml.NVMLError_NotSupported
    fake_pynvml.fail["nvmlDeviceGetTemperature"] = pynvml.NVMLError_Unknown
    fake_pynvml.fail["nvmlDeviceGetRemappedRows"] = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    fake_pynvml.fail["nvmlDeviceGetTotalEccErrors"] = lambda h: (
        pynvml.NVMLError_NoPermission() if h.index == 1 else None
    )
    first, second = NvmlCollector(Nvml(fake_pynvml)).sample(1.0)
    assert first.power_w is None and first.temp_c is None
    assert first.remapped_correctable is None and first.remap_pending is None
    assert first.util == 87 and first.ecc_dbe_volatile == 1  # the rest is still there
    assert second.ecc_sbe_volatile is None and second.ecc_dbe_volatile is None
    valid_on_the_wire(first)


def test_a_call_missing_from_an_older_binding_is_missing(fake_pynvml):
    class OldBinding(type(fake_pynvml)):
        def __getattribute__(self, name: str):
            if name == "nvmlDeviceGetCurrentClocksEventReasons":
                raise AttributeError(name)
            return super().__getattribute__(name)

    s = NvmlCollector(Nvml(OldBinding())).sample(1.0)[0]
    assert s.clock_event_reasons is None and s.util == 87


def test_unsupported_memory_temperature_field_is_missing(fake_pynvml):
    fake_pynvml.values["mem_temp"] = None
    s = NvmlCollector(Nvml(fake_pynvml)).sample(1.0)[0]
    assert s.mem_temp_c is None and s.temp_c == 64


def test_readings_outside_the_wire_bounds_become_missing(fake_pynvml):
    fake_pynvml.values["nvmlDeviceGetTemperature"] = 0xFFFFFFFF
    fake_pynvml.values["nvmlDeviceGetPcieReplayCounter"] = 2**64 - 1
    fake_pynvml.values["nvmlDeviceGetUtilizationRates"] = type("U", (), {"gpu": 255, "memory": 5})()
    s = NvmlCollector(Nvml(fake_pynvml)).sample(1.0)[0]
    assert s.temp_c is None and s.pcie_replay is None and s.util is None
    assert s.mem_util == 5
    valid_on_the_wire(s)


def test_inventory_converts_units(fake_pynvml):
    inv = NvmlCollector(Nvml(fake_pynvml)).inventory()
    assert [g.index for g in inv] == [0, 1]
    g = inv[1]
    assert g.uuid == "GPU-fake-1" and g.name == "NVIDIA H100 80GB HBM3"
    assert g.pci_bus_id == "00000000:19:00.0"
    assert g.memory_total_mib == 81559 and g.power_limit_w == 700 and g.driver == "550.90.07"


def test_a_gpu_unreadable_at_start_is_skipped_and_remembered(fake_pynvml):
    fake_pynvml.fail["nvmlDeviceGetHandleByIndex"] = lambda i: (
        pynvml.NVMLError_GpuIsLost() if i == 0 else None
    )
    c = NvmlCollector(Nvml(fake_pynvml))
    assert [d.uuid for d in c.devices] == ["GPU-fake-1"]
    assert c.unreadable == {0: "GPU is lost"}


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (pynvml.NVMLError_LibraryNotFound(), "NVML Shared Library Not Found"),
        (pynvml.NVMLError_DriverNotLoaded(), "Driver Not Loaded"),
        (OSError("libnvidia-ml.so.1: cannot open shared object file"), "libnvidia-ml.so.1"),
    ],
)
def test_init_failure_is_one_nvml_unavailable_with_a_one_line_reason(fake_pynvml, error, reason):
    fake_pynvml.init_error = error
    nvml = Nvml(fake_pynvml)
    with pytest.raises(NvmlUnavailable) as info:
        nvml.init()
    assert reason in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(NvmlUnavailable):
        nvml.query("nvmlDeviceGetCount")  # a query never hides an init failure


def test_the_real_binding_without_a_driver_raises_nvml_unavailable():
    nvml = Nvml()
    try:
        nvml.init()
    except NvmlUnavailable as exc:
        assert str(exc) and "\n" not in str(exc)
    else:  # a machine with a driver: the real library answers
        assert nvml.call("nvmlDeviceGetCount") >= 0
        nvml.shutdown()


def test_init_is_lazy_and_happens_once_under_concurrency(fake_pynvml):
    nvml = Nvml(fake_pynvml)
    assert fake_pynvml.init_calls == 0
    threads = [threading.Thread(target=nvml.query, args=("nvmlDeviceGetCount",)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake_pynvml.init_calls == 1


@pytest.mark.parametrize(
    ("spelling", "key"),
    [
        ("00000000:18:00.0", "0000:18:00"),
        ("0000:18:00", "0000:18:00"),
        ("0000:3B:00.0", "0000:3b:00"),
        ("18:00.0", "0000:18:00"),
        ("garbage", None),
    ],
)
def test_pci_addresses_normalise(spelling, key):
    assert pci_key(spelling) == key


def test_uuid_for_pci_matches_kernel_log_spelling(fake_pynvml):
    c = NvmlCollector(Nvml(fake_pynvml))
    assert c.uuid_for_pci("0000:19:00") == "GPU-fake-1"
    assert c.uuid_for_pci("0000:99:00") is None
