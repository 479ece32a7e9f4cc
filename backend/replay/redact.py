"""A trace's redaction (docs/replay.md, "The trace file"): hostnames renamed, tokens and
secrets removed; what the replay needs (job names, times, numbers) stays."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainguard.backend.replay.trace import Trace

# Bearer tokens (trainguard's `tg_...` and any `Bearer x`), and key=value secrets.
_TOKENS = re.compile(r"(Bearer\s+)\S+|\btg_[A-Za-z0-9_-]{8,}|((?:token|password|secret)=)\S+", re.I)


def redact_trace(tr: Trace) -> None:
    """Hostnames become node-1, node-2 ... (in the order of the trace's nodes) wherever a
    record names one, in messages and details too; tokens and secrets become
    `[redacted]`. Job names, times and numbers stay: the replay needs them."""
    hosts = {n["name"]: f"node-{i}" for i, n in enumerate(tr["node"], 1)}
    by_length = sorted(hosts, key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(h) for h in by_length)) if hosts else None

    def text(value: Any) -> Any:
        if isinstance(value, str):
            value = _TOKENS.sub(lambda m: f"{m.group(1) or m.group(2) or ''}[redacted]", value)
            if pattern is not None:
                value = pattern.sub(lambda m: hosts[m.group(0)], value)
            return value
        if isinstance(value, dict):
            return {k: text(v) for k, v in value.items()}
        if isinstance(value, list):
            return [text(v) for v in value]
        return value

    for kind in tr.records:
        tr.records[kind] = [text(r) for r in tr[kind]]
    tr.redacted = True
