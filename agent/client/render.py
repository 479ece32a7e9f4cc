"""Plain-text tables for a terminal: columns padded to their widest cell, times in UTC."""

from __future__ import annotations

import time
from collections.abc import Sequence

from trainguard.client.models import Incident

EMPTY = "-"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns two spaces apart; None shows as '-'."""
    cells = [list(headers), *([EMPTY if c is None else str(c) for c in r] for r in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


def when(ts: float | None) -> str | None:
    """2026-03-01 14:02:07.315 (UTC), to the millisecond the timeline needs."""
    if ts is None:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}"


def seconds(s: float | None) -> str | None:
    return None if s is None else f"{s:.1f} s"


def incidents(items: Sequence[Incident]) -> str:
    if not items:
        return "no incidents"
    rows = [
        (
            i.id,
            i.job,
            i.status,
            i.level,
            i.trigger if not i.triggered_by else f"{i.trigger} ({i.triggered_by})",
            i.cause,
            i.node,
            when(i.created_at),
            seconds(i.recovery_s),
        )
        for i in items
    ]
    headers = (
        "ID",
        "JOB",
        "STATUS",
        "LEVEL",
        "TRIGGER",
        "CAUSE",
        "NODE",
        "CREATED (UTC)",
        "RECOVERY",
    )
    return table(headers, rows)


def incident(i: Incident) -> str:
    """The incident's facts, then its timeline: the recovery marks, the decisions, the
    evidence and each command's acks, in the order they happened."""
    facts = [
        f"incident {i.id}  job {i.job or EMPTY}  status {i.status}  level {i.level or EMPTY}",
        f"trigger {i.trigger or EMPTY}"
        + (f" by {i.triggered_by}" if i.triggered_by else "")
        + (f"  cause {i.cause}" if i.cause else "")
        + (f"  node {i.node}" if i.node else "")
        + (f"  xid {i.xid}" if i.xid is not None else ""),
    ]
    if i.reason:
        facts.append(f"reason {i.reason}")
    if i.outcome:
        facts.append(f"outcome {i.outcome}")
    tail = []
    if i.recovery_s is not None:
        tail.append(f"recovery {i.recovery_s:.1f} s")
    if i.lost_steps is not None:
        tail.append(f"lost steps {i.lost_steps}")
    if tail:
        facts.append("  ".join(tail))

    entries: list[tuple[float, int, str, str]] = []  # (time, tie-break, what, detail)
    for n, (mark, ts) in enumerate(i.timeline.marks()):
        entries.append((ts, n, mark, ""))
    for d in i.decisions:
        if d.at is not None:
            by = f" by {d.by}" if d.by else ""
            what = f"decision ({d.mode})" if d.mode else "decision"
            entries.append((d.at, 10, what, f"{d.level or EMPTY}{by}: {d.why or ''}".strip()))
    for e in i.evidence:
        if e.ts is not None:
            where = ", ".join(
                x
                for x in (
                    e.node and f"node {e.node}",
                    e.rank is not None and f"rank {e.rank}",
                    e.xid is not None and f"xid {e.xid}",
                    e.cause,
                )
                if x
            )
            entries.append((e.ts, 20, f"evidence {e.kind}", where))
    for c in i.commands:
        for a in c.acks:
            detail = f"{c.action or 'command'} {c.id[:8]} on {c.node or EMPTY}"
            if a.detail:
                detail += f": {a.detail}"
            entries.append((a.ts, 30, f"ack {a.phase}", detail))
    entries.sort(key=lambda e: (e[0], e[1]))
    if not entries:
        return "\n".join([*facts, "", "no timeline yet"])
    origin = i.timeline.fault_at if i.timeline.fault_at is not None else entries[0][0]
    rows = [(when(ts), f"{ts - origin:+.3f}", what, detail) for ts, _, what, detail in entries]
    return "\n".join([*facts, "", table(("TIME (UTC)", "+S", "WHAT", "DETAIL"), rows)])
