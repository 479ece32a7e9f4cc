"""NVIDIA's XID catalog: what each XID means and the action NVIDIA recommends.

Data and lookup only: the agent's XID watchers (`trainguard.agent.collectors.xid_watchers`)
label the events they report with it, the backend's policy, evidence and catalog page read
it."""

from __future__ import annotations

from typing import NamedTuple


class XidInfo(NamedTuple):
    meaning: str
    action: str  # NVIDIA's "Resolution Bucket (Immediate Action)"


# From reference/xid-and-nvml.md (NVIDIA's Xid catalog).
XID_CATALOG: dict[int, XidInfo] = {
    13: XidInfo("graphics engine exception (usually the application)", "RESTART_APP"),
    31: XidInfo("GPU memory page fault (usually the application)", "RESTART_APP"),
    32: XidInfo("corrupted push buffer stream", "RESTART_APP"),
    38: XidInfo("driver firmware error", "IGNORE"),
    43: XidInfo("GPU stopped processing (channel reset)", "IGNORE"),
    45: XidInfo("preemptive cleanup after earlier errors", "RESTART_APP"),
    46: XidInfo("GPU timeout", "RESET_GPU"),
    48: XidInfo("double-bit ECC error", "RESET_GPU"),
    61: XidInfo("PMU breakpoint", "CONTACT_SUPPORT"),
    62: XidInfo("PMU halt", "RESET_GPU"),
    63: XidInfo("row remap / page retirement event", "IGNORE"),
    64: XidInfo("row remap failure", "RESET_GPU"),
    68: XidInfo("NVDEC exception", "RESTART_APP"),
    69: XidInfo("graphics class error", "RESTART_APP"),
    74: XidInfo("NVLink error", "WORKFLOW_NVLINK"),
    79: XidInfo("GPU has fallen off the bus", "RESTART_BM"),
    92: XidInfo("excessive single-bit ECC rate", "IGNORE"),
    94: XidInfo("contained ECC error", "RESTART_APP"),
    95: XidInfo("uncontained ECC error", "RESET_GPU"),
    109: XidInfo("context switch timeout", "RESET_GPU"),
    119: XidInfo("GSP RPC timeout", "RESET_GPU"),
    120: XidInfo("GSP error", "RESET_GPU"),
    121: XidInfo("C2C link error", "IGNORE"),
    140: XidInfo("unrecovered ECC error", "RESET_GPU"),
    143: XidInfo("GPU init error", "RESET_GPU"),
    **{x: XidInfo("NVLink5 error", "WORKFLOW_NVLINK5") for x in range(144, 151)},
    154: XidInfo("GPU recovery action changed (refers to another XID)", "IGNORE"),
}
UNKNOWN_XID = XidInfo("unknown XID", "UNKNOWN")


def describe_xid(xid: int) -> XidInfo:
    return XID_CATALOG.get(xid, UNKNOWN_XID)
