"""What a webhook receives: a generic JSON document, or a Slack-compatible message."""

from __future__ import annotations

import time
from typing import Any

PAYLOAD_VERSION = 1
# The incident fields a generic receiver gets (the dashboard link has the rest).
INCIDENT_FIELDS = (
    "id",
    "job",
    "status",
    "level",
    "cause",
    "trigger",
    "triggered_by",
    "reason",
    "outcome",
    "node",
    "gpu_uuid",
    "xid",
    "escalations",
    "fault_step",
    "lost_steps",
    "recovery_s",
    "timeline",
)
_ICON = {
    "incident_opened": ":rotating_light:",
    "escalation": ":arrow_double_up:",
    "stop_job": ":octagonal_sign:",
    "incident_resolved": ":white_check_mark:",
    "incident_failed": ":x:",
    "test": ":wave:",
}


def summary(kind: str, inc: dict[str, Any], detail: str = "") -> str:
    """One line for a human (the Slack text, the generic `summary`)."""
    ref = f"incident #{inc.get('id')} on job {inc.get('job')}"
    where = []
    if inc.get("node"):
        where.append(f"node {inc['node']}")
    if inc.get("xid") is not None:
        where.append(f"XID {inc['xid']}")
    at = f" ({', '.join(where)})" if where else ""
    if kind == "incident_opened":
        line = f"{ref} opened: {inc.get('cause')} -> {inc.get('level')}{at}"
    elif kind == "escalation":
        line = f"{ref} escalated to {inc.get('level')}{at}"
    elif kind == "stop_job":
        line = f"{ref}: the job was stopped, trainguard gave up restarting it{at}"
    elif kind == "incident_resolved":
        rec = inc.get("recovery_s")
        took = f" after {rec:.1f} s" if isinstance(rec, int | float) else ""
        lost = f", {inc['lost_steps']} steps recomputed" if inc.get("lost_steps") else ""
        line = f"{ref} resolved: training resumed{took} ({inc.get('level')}){lost}"
    elif kind == "incident_failed":
        line = f"{ref} failed: {inc.get('outcome') or 'the restart did not complete'}"
    else:
        line = f"trainguard test alert{': ' + detail if detail else ''}"
        detail = ""
    return f"{line}. {detail}".strip() if detail else line


def generic_body(
    kind: str, inc: dict[str, Any], detail: str, url: str | None, at: float | None = None
) -> dict[str, Any]:
    return {
        "version": PAYLOAD_VERSION,
        "source": "trainguard",
        "kind": kind,
        "at": at if at is not None else time.time(),
        "summary": summary(kind, inc, detail),
        "detail": detail,
        "url": url,
        "incident": {k: inc.get(k) for k in INCIDENT_FIELDS if k in inc},
    }


def slack_body(kind: str, inc: dict[str, Any], detail: str, url: str | None) -> dict[str, Any]:
    """An incoming-webhook message: `text` for notifications, blocks for the channel."""
    text = f"{_ICON.get(kind, '')} {summary(kind, inc, detail)}".strip()
    facts = [
        f"*{k}:* {inc[k]}"
        for k in ("status", "level", "cause", "node", "gpu_uuid", "lost_steps")
        if inc.get(k) not in (None, "")
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": text}},
    ]
    if facts:
        blocks.append(
            {"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(facts)}]}
        )
    if url:
        blocks.append(
            {
                "type": "context",
                "elements": [{"type": "mrkdwn", "text": f"<{url}|open in trainguard>"}],
            }
        )
    return {"text": text, "blocks": blocks}
