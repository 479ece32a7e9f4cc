from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from trainguard.agent.collectors.nvml import Nvml, NvmlCollector
from trainguard.agent.collectors.xid_watchers import (
    KmsgWatcher,
    XidDedup,
    XidRecord,
    XidWatcher,
    parse_kmsg_line,
)
from trainguard.agent.uplink.outbox import Outbox
from trainguard.protocol.xid import XID_CATALOG, describe_xid

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    import pynvml

# Real line shapes from dmesg, syslog and /dev/kmsg, one per format the driver uses.
LINES = [
    (
        "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
        XidRecord(79, "0000:18:00", 1234, "python", "GPU has fallen off the bus."),
    ),
    (  # older drivers: no "PCI:", no pid/name
        "NVRM: Xid (0000:03:00): 13, 0003 00000000 0000a1c0 00001b0c 00001000 00000000",
        XidRecord(
            13, "0000:03:00", None, None, "0003 00000000 0000a1c0 00001b0c 00001000 00000000"
        ),
    ),
    (  # dmesg timestamp
        "[ 8141.120212] NVRM: Xid (PCI:0000:3b:00): 48, pid=2345, name=python3, An uncorrectable "
        "double bit error (DBE) has been detected on GPU in the framebuffer at partition 6.",
        XidRecord(
            48,
            "0000:3b:00",
            2345,
            "python3",
            "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
            "at partition 6.",
        ),
    ),
    (  # MIG: GPU instance
        "NVRM: Xid (PCI:0000:4b:00 GPU-I:05): 31, pid=3456, name=pt_main_thread, Ch 00000008, "
        "intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_3c000000",
        XidRecord(
            31,
            "0000:4b:00",
            3456,
            "pt_main_thread",
            "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
            "0x7f2a_3c000000",
            gpu_instance=5,
        ),
    ),
    (  # MIG: GPU instance and compute instance
        "NVRM: Xid (PCI:0000:4b:00 GPU-I:01 GPU-CI:02): 43, pid=4567, name=python, Ch 00000010",
        XidRecord(43, "0000:4b:00", 4567, "python", "Ch 00000010", 1, 2),
    ),
    (  # pid and name unknown
        "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.",
        XidRecord(79, "0000:3b:00", None, None, "GPU has fallen off the bus."),
    ),
    (  # /dev/kmsg record
        "4,1234,5678901234,-;NVRM: Xid (PCI:0000:18:00): 94, pid=999, name=python, Contained: SM "
        "(0x1). RST: No, D-RST: No",
        XidRecord(94, "0000:18:00", 999, "python", "Contained: SM (0x1). RST: No, D-RST: No"),
    ),
    (  # syslog
        "Nov 29 11:00:00 node1 kernel: [ 1234.500000] NVRM: Xid (PCI:0000:b7:00): 119, pid=77, "
        "name=torchrun, Timeout after 6s of waiting for RPC response from GPU1 GSP!",
        XidRecord(
            119,
            "0000:b7:00",
            77,
            "torchrun",
            "Timeout after 6s of waiting for RPC response from GPU1 GSP!",
        ),
    ),
    (  # recent drivers, no pid/name
        "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 "
        "(GPU Reset Required)\n",
        XidRecord(
            154,
            "0000:01:00",
            None,
            None,
            "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
        ),
    ),
    (  # a /dev/kmsg record with its continuation lines
        "6,1234,5678,-;NVRM: Xid (PCI:0000:18:00): 45, pid=10, name=python, Ch 00000010\n"
        " SUBSYSTEM=pci\n DEVICE=+pci:0000:18:00.0\n",
        XidRecord(45, "0000:18:00", 10, "python", "Ch 00000010"),
    ),
    (  # XID 79 without an "Xid" token
        "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
        XidRecord(79, "0000:18:00", message="GPU has fallen off the bus."),
    ),
    (
        "3,2345,6789,-;NVRM: GPU 0000:3B:00.0: GPU has fallen off the bus.",
        XidRecord(79, "0000:3b:00", message="GPU has fallen off the bus."),
    ),
]

NOT_XID = [
    "",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024",
    "NVRM: GPU at PCI:0000:18:00: GPU-1b2c3d4e-0000-1111-2222-333344445555",
    "NVRM: Xid",
    "NVRM: Xid (PCI:0000:18:00): not-a-number",
    "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    "6,1200,100,-;nvidia-nvswitch0: SXid (PCI:0000:8a:00.0): 12028, Non-fatal, Link 32",
    " SUBSYSTEM=pci",
]


@pytest.mark.parametrize(("line", "record"), LINES)
def test_kernel_log_xid_lines_parse(line, record):
    assert parse_kmsg_line(line) == record


@pytest.mark.parametrize("line", NOT_XID)
def test_lines_without_an_xid_parse_to_none(line):
    assert parse_kmsg_line(line) is None


def test_catalog_carries_the_reference_actions():
    assert XID_CATALOG[79] == ("GPU has fallen off the bus", "RESTART_BM")
    meaning, action = XID_CATALOG[13]
    assert action == "RESTART_APP" and "application" in meaning
    assert XID_CATALOG[48].action == XID_CATALOG[64].action == "RESET_GPU"
    assert XID_CATALOG[63].action == "IGNORE"
    assert all(XID_CATALOG[x].action == "WORKFLOW_NVLINK5" for x in range(144, 151))
    assert describe_xid(99999).action == "UNKNOWN"


def test_dedup_reports_each_gpu_xid_once_per_window():
    now = [100.0]
    d = XidDedup(window_s=10, clock=lambda: now[0])
    assert d.first("GPU-a", 79) and not d.first("GPU-a", 79)
    assert d.first("GPU-b", 79) and d.first("GPU-a", 48)
    now[0] += 11
    assert d.first("GPU-a", 79)


# --- NVML event watcher -----------------------------------------------------------------


def nvml_watcher(fake, outbox, dedup=None):
    c = NvmlCollector(Nvml(fake))
    return XidWatcher(
        c.nvml, c.devices, outbox, dedup, clock=lambda: 1234.5, wait_ms=20, error_pause_s=0.01
    )


def test_nvml_xid_event_becomes_an_urgent_event(fake_pynvml, wait_for):
    outbox = Outbox()
    w = nvml_watcher(fake_pynvml, outbox)
    w.start()
    try:
        assert [m for _, m in fake_pynvml.registered] == [pynvml.nvmlEventTypeXidCriticalError] * 2
        fake_pynvml.xid(1, 48)
        wait_for(lambda: outbox.urgent.is_set(), what="urgent flag")
    finally:
        w.stop()
    (e,) = outbox.drain(10, 10, 10).events
    assert (e.kind, e.xid, e.gpu_uuid, e.ts) == ("xid", 48, "GPU-fake-1", 1234.5)
    assert e.data == {"source": "nvml", "action": "RESET_GPU"}


def test_gpu_is_lost_from_the_wait_is_one_gpu_lost_event_as_xid_79(fake_pynvml, wait_for):
    outbox = Outbox()
    fake_pynvml.fail["nvmlDeviceGetTemperature"] = lambda h: (
        pynvml.NVMLError_GpuIsLost() if h.index == 0 else None
    )
    w = nvml_watcher(fake_pynvml, outbox)
    w.start()
    try:
        for _ in range(3):  # the driver keeps saying so
            fake_pynvml.events.put(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))
        wait_for(lambda: fake_pynvml.events.empty() and w.reported, what="lost report")
    finally:
        w.stop()
    (e,) = outbox.drain(10, 10, 10).events
    assert (e.kind, e.xid, e.gpu_uuid) == ("gpu_lost", 79, "GPU-fake-0")
    assert e.data["source"] == "nvml" and e.data["action"] == "RESTART_BM"


def test_devices_without_xid_event_support_are_not_registered(fake_pynvml):
    fake_pynvml.values["nvmlDeviceGetSupportedEventTypes"] = pynvml.nvmlEventTypeSingleBitEccError
    w = nvml_watcher(fake_pynvml, Outbox())
    w.start()
    assert not w.active and w.registered == []
    w.stop()


# --- kernel log watcher -------------------------------------------------------------------


def test_kmsg_watcher_follows_appended_lines_and_maps_pci_to_uuid(tmp_path: Path, wait_for):
    log = tmp_path / "kern.log"
    log.write_text("NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=old, before the agent started\n")
    outbox = Outbox()
    uuids = {"0000:18:00": "GPU-a", "0000:3b:00": "GPU-b"}
    w = KmsgWatcher(log, outbox, resolve=uuids.get, clock=lambda: 99.0, poll_s=0.01)
    w.start()
    try:
        with log.open("a") as f:
            f.write("usb 1-1: new device\n")
            f.write("[ 12.3] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unkn")
            f.flush()
            f.write("own>, GPU has fallen off the bus.\n")  # a line written in two pieces
            f.flush()
        wait_for(lambda: w.reported == 1, what="the xid from the log")
    finally:
        w.stop()
    assert outbox.urgent.is_set()
    (e,) = outbox.drain(10, 10, 10).events
    assert (e.kind, e.xid, e.gpu_uuid, e.ts) == ("xid", 79, "GPU-b", 99.0)
    assert e.data == {"source": "kmsg", "action": "RESTART_BM", "pci": "0000:3b:00"}


def test_kmsg_duplicate_of_an_nvml_report_is_dropped(tmp_path: Path):
    dedup = XidDedup()
    assert dedup.first("GPU-a", 48)  # what the NVML watcher saw first
    w = KmsgWatcher(tmp_path / "x", Outbox(), resolve=lambda pci: "GPU-a", dedup=dedup)
    assert not w.handle_line("NVRM: Xid (PCI:0000:18:00): 48, pid=5, name=p, DBE")
    assert w.handle_line("NVRM: Xid (PCI:0000:18:00): 63, pid=5, name=p, row remap")


def test_kmsg_watcher_on_a_missing_or_unreadable_log_stays_off(tmp_path: Path):
    w = KmsgWatcher(tmp_path / "nope", Outbox())
    w.start()
    assert not w.active
    w.stop()


def test_kmsg_watcher_on_a_character_device_starts_and_stops(wait_for):
    w = KmsgWatcher(Path("/dev/null"), Outbox(), poll_s=0.01)
    w.start()
    assert w.active
    w.stop()
    assert not w.active
