"""The node's collectors: NVML (or the simulated GPUs) and the XID watchers."""
