"""The exclusion modes' tables for `trainguard bench recovery`'s report
(backend/bench/recovery_exclusion.py measures them)."""

from __future__ import annotations

from typing import Any

from trainguard.backend.bench.recovery_exclusion import EXCLUSION_MODES

PHASES = (
    ("decided_s", "decided"),
    ("left_s", "node left (left_at)"),
    ("old_gone_s", "old workers gone"),
    ("rendezvous_s", "round re-formed (last launcher joined)"),
    ("attached_s", "new workers attached"),
    ("restore_end_s", "checkpoint loaded"),
    ("recovery_s", "first step done (recovery)"),
    ("regrown_s", "grow-back restart -> first step (shrink)"),
)


def phases_table(rows: list[tuple[str, list[dict[str, Any]]]]) -> str:
    """Median seconds from the fault to each phase of an exclusion, per mode (the last
    column: from the readmission)."""
    from trainguard.backend.bench import recovery

    return recovery.phases_table(rows, PHASES)


def faults_table(result: dict[str, Any]) -> str:
    """Per fault of each exclusion mode: the node, the incident and its phases."""
    out = [
        "| mode, fault | node (GPU) | incident | fault -> decided / left / re-formed "
        "/ first step (s) | resumed at step |",
        "|---|---|---|---|---|",
    ]
    for mode, r in result["modes"].items():
        if mode not in EXCLUSION_MODES:
            continue
        resumed = {f["index"]: f.get("resumed_at_step") for f in r["per_fault"]}
        for f in r["phases"]:
            inc = f"{f['cause']} -> {f['level']} ({f['status']}): {f['outcome']}"
            times = " / ".join(
                str(f.get(k)) for k in ("decided_s", "left_s", "rendezvous_s", "recovery_s")
            )
            out.append(
                f"| {mode}, {f['index']} | {f['node']} ({f['gpu']}) | {inc} | {times} "
                f"| {resumed.get(f['index'])} |"
            )
    return "\n".join(out)
