"""XID errors: the kernel-log parser and the two watchers (NVIDIA's catalog, what each
XID means and its action, is `trainguard.protocol.xid`).

`XidWatcher` waits on an NVML event set (the primary source); `KmsgWatcher` follows the
kernel log (the fallback, and the only source for "GPU has fallen off the bus" lines on
drivers that report no event). Both feed urgent `Event`s into the Outbox; a shared
`XidDedup` keeps one XID seen by both from being reported twice.
"""

from __future__ import annotations

import logging
import os
import re
import select
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

from trainguard.agent.collectors.nvml import Device, Nvml, pci_key
from trainguard.agent.uplink.outbox import Outbox
from trainguard.protocol.payloads import XidData
from trainguard.protocol.wire import Event
from trainguard.protocol.xid import describe_xid

log = logging.getLogger(__name__)


def xid_event(
    xid: int,
    ts: float,
    source: str,
    gpu_uuid: str | None = None,
    message: str = "",
    kind: Literal["xid", "gpu_lost"] = "xid",
    *,
    pci: str | None = None,
    pid: int | None = None,
    process: str | None = None,
    gpu_instance: int | None = None,
    compute_instance: int | None = None,
) -> Event:
    """The wire event for one XID; its data (XidData) says where it was read, the
    catalog's action, and what else is known (None: not known, left out)."""
    info = describe_xid(xid)
    data = XidData(
        source=source,
        action=info.action,
        pci=pci,
        pid=pid,
        process=process,
        gpu_instance=gpu_instance,
        compute_instance=compute_instance,
    )
    return Event(
        kind=kind,
        ts=ts,
        gpu_uuid=gpu_uuid,
        xid=xid,
        message=(message or f"Xid {xid}: {info.meaning}")[:4096],
        data=data.wire(),
    )


# --- kernel log -----------------------------------------------------------------------

_PCI = r"[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
_XID_RE = re.compile(
    rf"NVRM: Xid \((?:PCI:)?(?P<pci>{_PCI})"
    r"(?:\s+GPU-I:(?P<gi>\d+))?(?:\s+GPU-CI:(?P<ci>\d+))?\):\s*(?P<xid>\d+)\b,?\s*(?P<rest>.*)$"
)
_PID_NAME_RE = re.compile(r"^pid='?(?P<pid>[^,']*)'?,\s*name=(?P<name>[^,]*),?\s*(?P<msg>.*)$")
_OFF_BUS_RE = re.compile(
    rf"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>{_PCI}):? GPU has fallen off the bus"
)


@dataclass(frozen=True)
class XidRecord:
    xid: int
    pci: str | None  # normalised `0000:18:00`
    pid: int | None = None
    process: str | None = None
    message: str = ""
    gpu_instance: int | None = None
    compute_instance: int | None = None


def parse_kmsg_line(line: str) -> XidRecord | None:
    """One kernel log line (dmesg, syslog or /dev/kmsg record) -> XidRecord, or None."""
    if "NVRM:" not in line:
        return None
    line = line.split("\n", 1)[0].rstrip("\r")  # a /dev/kmsg record may carry " KEY=VALUE" lines
    m = _XID_RE.search(line)
    if m:
        pid: int | None = None
        process: str | None = None
        msg = m["rest"].strip()
        pn = _PID_NAME_RE.match(msg)
        if pn:
            pid = int(pn["pid"]) if pn["pid"].isdigit() else None
            name = pn["name"].strip()
            process = None if name in ("", "<unknown>") else name
            msg = pn["msg"].strip()
        return XidRecord(
            xid=int(m["xid"]),
            pci=pci_key(m["pci"]),
            pid=pid,
            process=process,
            message=msg,
            gpu_instance=int(m["gi"]) if m["gi"] else None,
            compute_instance=int(m["ci"]) if m["ci"] else None,
        )
    m = _OFF_BUS_RE.search(line)
    if m:
        return XidRecord(xid=79, pci=pci_key(m["pci"]), message="GPU has fallen off the bus.")
    return None


class XidDedup:
    """First report of (gpu, xid) within `window_s` wins; later ones are duplicates."""

    def __init__(self, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._window = window_s
        self._clock = clock
        self._seen: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()

    def first(self, gpu_key: str | None, xid: int) -> bool:
        now = self._clock()
        key = (gpu_key or "?", xid)
        with self._lock:
            if len(self._seen) > 4096:
                self._seen = {k: t for k, t in self._seen.items() if now - t < self._window}
            last = self._seen.get(key)
            self._seen[key] = now
        return last is None or now - last >= self._window


def report_record(
    rec: XidRecord,
    outbox: Outbox,
    ts: float,
    gpu_uuid: str | None,
    dedup: XidDedup | None = None,
) -> bool:
    """Put one parsed kernel-log XID into the outbox (urgent); False if a duplicate."""
    if dedup is not None and not dedup.first(gpu_uuid or rec.pci, rec.xid):
        return False
    msg = f"Xid {rec.xid}: {rec.message}" if rec.message else ""
    outbox.put_event(
        xid_event(
            rec.xid,
            ts,
            "kmsg",
            gpu_uuid=gpu_uuid,
            message=msg,
            pci=rec.pci,
            pid=rec.pid,
            process=rec.process,
            gpu_instance=rec.gpu_instance,
            compute_instance=rec.compute_instance,
        ),
        urgent=True,
    )
    return True


# --- watchers -------------------------------------------------------------------------

_NO_INSTANCE = 0xFFFFFFFF


class XidWatcher:
    """Waits on an NVML event set for XIDs on every device (one thread)."""

    def __init__(
        self,
        nvml: Nvml,
        devices: list[Device],
        outbox: Outbox,
        dedup: XidDedup | None = None,
        clock: Callable[[], float] = time.time,
        wait_ms: int = 500,
        error_pause_s: float = 1.0,
    ) -> None:
        self.nvml, self.devices, self.outbox = nvml, devices, outbox
        self.dedup, self.clock, self.wait_ms = dedup, clock, wait_ms
        self.error_pause_s = error_pause_s
        self.registered: list[Device] = []
        self.reported = 0
        self._set: Any = None
        self._lost: set[str] = set()
        self._lost_unknown = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Register every device that supports XID events; start only if one does."""
        lib = self.nvml.lib
        try:
            self._set = self.nvml.call("nvmlEventSetCreate")
        except lib.NVMLError as exc:
            log.warning("NVML event set unavailable (%s); XIDs from the kernel log only", exc)
            return
        for d in self.devices:
            supported = self.nvml.query("nvmlDeviceGetSupportedEventTypes", d.handle, default=0)
            mask = lib.nvmlEventTypeXidCriticalError & int(supported)
            if not mask:
                continue
            try:
                self.nvml.call("nvmlDeviceRegisterEvents", d.handle, mask, self._set)
            except lib.NVMLError as exc:
                log.warning("GPU %d: cannot register for XID events: %s", d.index, exc)
                continue
            self.registered.append(d)
        if not self.registered:
            log.info("no GPU supports NVML XID events; XIDs from the kernel log only")
            self._free()
            return
        self._thread = threading.Thread(target=self._run, name="xid-nvml", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.wait_ms / 1000 + 2)

    def _run(self) -> None:
        lib = self.nvml.lib
        try:
            while not self._stop.is_set():
                try:
                    data = self.nvml.call("nvmlEventSetWait_v2", self._set, self.wait_ms)
                except lib.NVMLError as exc:
                    code = self.nvml.error_code(exc)
                    if code == lib.NVML_ERROR_TIMEOUT:
                        continue
                    if code == lib.NVML_ERROR_GPU_IS_LOST:
                        self._on_lost()
                    else:
                        log.warning("NVML event wait failed: %s", exc)
                    self._stop.wait(self.error_pause_s)  # no busy loop on a persistent error
                    continue
                self._on_event(data)
        finally:
            self._free()

    def _on_event(self, data: Any) -> None:
        lib = self.nvml.lib
        if not int(getattr(data, "eventType", 0)) & lib.nvmlEventTypeXidCriticalError:
            return
        xid = int(data.eventData)
        uuid = self.nvml.query("nvmlDeviceGetUUID", data.device)
        if xid == 79 and uuid:
            self._lost.add(uuid)
        if self.dedup is not None and not self.dedup.first(uuid, xid):
            return
        gi = int(getattr(data, "gpuInstanceId", _NO_INSTANCE))
        ci = int(getattr(data, "computeInstanceId", _NO_INSTANCE))
        self.outbox.put_event(
            xid_event(
                xid,
                self.clock(),
                "nvml",
                gpu_uuid=uuid,
                gpu_instance=gi if gi != _NO_INSTANCE else None,
                compute_instance=ci if ci != _NO_INSTANCE else None,
            ),
            urgent=True,
        )
        self.reported += 1

    def _on_lost(self) -> None:
        """GPU_IS_LOST from the wait: report each lost GPU once, as a gpu_lost with XID 79."""
        lib = self.nvml.lib
        found = False
        for d in self.registered:
            if d.uuid in self._lost:
                found = True
                continue
            try:
                self.nvml.call("nvmlDeviceGetTemperature", d.handle, lib.NVML_TEMPERATURE_GPU)
                continue
            except lib.NVMLError as exc:
                if self.nvml.error_code(exc) != lib.NVML_ERROR_GPU_IS_LOST:
                    continue
            found = True
            self._lost.add(d.uuid)
            self._report_lost(d.uuid, d.pci_bus_id)
        if not found and not self._lost_unknown:
            self._lost_unknown = True
            self._report_lost(None, "")

    def _report_lost(self, uuid: str | None, pci: str) -> None:
        if self.dedup is not None and not self.dedup.first(uuid or pci_key(pci), 79):
            return
        self.outbox.put_event(
            xid_event(
                79,
                self.clock(),
                "nvml",
                gpu_uuid=uuid,
                message="NVML: GPU is lost (treated as Xid 79)",
                kind="gpu_lost",
                pci=pci or None,
            ),
            urgent=True,
        )
        self.reported += 1

    def _free(self) -> None:
        if self._set is not None:
            self.nvml.query("nvmlEventSetFree", self._set)
            self._set = None


class KmsgWatcher:
    """Follows a kernel log: /dev/kmsg from its end, or a regular file's appended lines."""

    def __init__(
        self,
        path: Path,
        outbox: Outbox,
        resolve: Callable[[str], str | None] = lambda pci: None,
        dedup: XidDedup | None = None,
        clock: Callable[[], float] = time.time,
        poll_s: float = 0.2,
    ) -> None:
        self.path, self.outbox, self.resolve = path, outbox, resolve
        self.dedup, self.clock, self.poll_s = dedup, clock, poll_s
        self.reported = 0
        self._fd: int | None = None
        self._file: BinaryIO | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Open and seek to the end now (so later lines are seen), then follow in a thread."""
        try:
            if stat.S_ISCHR(os.stat(self.path).st_mode):
                self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
                os.lseek(self._fd, 0, os.SEEK_END)
                target = self._follow_kmsg
            else:
                self._file = open(self.path, "rb")  # noqa: SIM115 - closed by the thread
                self._file.seek(0, os.SEEK_END)
                target = self._follow_file
        except OSError as exc:
            log.warning(
                "kernel log %s unavailable (%s); XIDs from NVML events only",
                self.path,
                exc.strerror or exc,
            )
            return
        self._thread = threading.Thread(target=target, name="xid-kmsg", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_s + 2)

    def handle_line(self, line: str) -> bool:
        rec = parse_kmsg_line(line)
        if rec is None:
            return False
        uuid = self.resolve(rec.pci) if rec.pci else None
        if report_record(rec, self.outbox, self.clock(), uuid, self.dedup):
            self.reported += 1
            return True
        return False

    def _follow_kmsg(self) -> None:
        assert self._fd is not None
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([self._fd], [], [], self.poll_s)
                if not ready:
                    continue
                try:
                    record = os.read(self._fd, 8192)
                except (BlockingIOError, BrokenPipeError):
                    continue  # EPIPE: older records were overwritten; carry on
                if not record:  # not a kmsg-like device after all: do not spin
                    self._stop.wait(self.poll_s)
                    continue
                self.handle_line(record.decode("utf-8", "replace"))
        finally:
            os.close(self._fd)

    def _follow_file(self) -> None:
        f = self._file
        assert f is not None
        partial = b""
        try:
            while not self._stop.is_set():
                chunk = f.readline()
                if chunk.endswith(b"\n"):
                    self.handle_line((partial + chunk).decode("utf-8", "replace"))
                    partial = b""
                    continue
                partial += chunk
                if self._rotated(f):
                    f.close()
                    f = self._file = open(self.path, "rb")  # noqa: SIM115 - closed by the thread
                    partial = b""
                    continue
                self._stop.wait(self.poll_s)
        finally:
            f.close()

    def _rotated(self, f: BinaryIO) -> bool:
        """True when the file was truncated or replaced (log rotation)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return st.st_ino != os.fstat(f.fileno()).st_ino or st.st_size < f.tell()
