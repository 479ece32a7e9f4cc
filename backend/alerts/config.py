"""Alert webhooks: what to call, in which format, for which alerts.

Configured in a TOML file (`TRAINGUARD_ALERTS_FILE`, example in
deploy/alerts.example.toml), one `[[webhook]]` table each. A secret URL (a Slack
incoming webhook is one) can stay out of the file: `url_env` names the environment
variable that holds it. Errors name the webhook and the key, like the policy file's.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# incident_opened: the engine (or an operator) opened an incident; escalation: a stronger
# level was chosen within an incident; stop_job: the engine gave up on a job;
# incident_resolved / incident_failed: the episode ended; needs_approval: a decision waits
# for an operator (a dry-run recommendation, an exclusion held by the breaker);
# job_waiting: no schedulable node is left for a job; test: `send_test`.
AlertKind = Literal[
    "incident_opened",
    "incident_resolved",
    "incident_failed",
    "escalation",
    "stop_job",
    "needs_approval",
    "job_waiting",
    "test",
]
ALERT_KINDS: tuple[AlertKind, ...] = get_args(AlertKind)


class AlertsConfigError(ValueError):
    """A bad alerts file; str() is one line naming the webhook and the key."""


class Webhook(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64)
    url: str = Field(default="", repr=False)  # a Slack webhook's path is its secret
    url_env: str | None = None  # read the URL from this environment variable instead
    format: Literal["json", "slack"] = "json"
    events: tuple[AlertKind, ...] = ALERT_KINDS
    timeout_s: float = Field(default=5.0, gt=0, le=60)
    retries: int = Field(default=3, ge=0, le=10)
    headers: dict[str, str] = Field(default_factory=dict, repr=False)

    @model_validator(mode="after")
    def _resolve_url(self) -> Webhook:
        url = self.url
        if self.url_env:
            url = os.environ.get(self.url_env, "")
            if not url:
                raise ValueError(f"url_env: environment variable {self.url_env} is not set")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http:// or https:// URL, got {url[:40]!r}")
        object.__setattr__(self, "url", url)
        return self

    @field_validator("events")
    @classmethod
    def _some_events(cls, v: tuple[AlertKind, ...]) -> tuple[AlertKind, ...]:
        if not v:
            raise ValueError("events is empty: this webhook would never be called")
        return v

    @property
    def where(self) -> str:
        """The URL without its path (Slack's path is the secret): for logs and metrics."""
        scheme, _, rest = self.url.partition("://")
        return f"{scheme}://{rest.split('/', 1)[0]}"


def parse_webhooks(doc: dict[str, object]) -> list[Webhook]:
    unknown = sorted(set(doc) - {"webhook"})
    if unknown:
        raise AlertsConfigError(f"unknown key {unknown[0]!r} (expected [[webhook]] tables)")
    raw = doc.get("webhook", [])
    if not isinstance(raw, list):
        raise AlertsConfigError("webhook must be an array of tables: [[webhook]]")
    hooks: list[Webhook] = []
    for i, entry in enumerate(raw):
        label = entry.get("name", f"#{i + 1}") if isinstance(entry, dict) else f"#{i + 1}"
        try:
            hooks.append(Webhook.model_validate(entry))
        except ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(str(p) for p in err["loc"])
            msg = str(err["msg"]).removeprefix("Value error, ")
            raise AlertsConfigError(f"webhook {label}: {key + ': ' if key else ''}{msg}") from None
    names = [h.name for h in hooks]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise AlertsConfigError(f"webhook {dup[0]}: name used twice")
    return hooks


def load_webhooks(path: str | Path | None) -> list[Webhook]:
    """The webhooks of an alerts file (none without one)."""
    if path is None or str(path) == "":
        return []
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text())
    except OSError as exc:
        raise AlertsConfigError(f"cannot read {p}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise AlertsConfigError(f"{p}: {exc}") from None
    try:
        return parse_webhooks(doc)
    except AlertsConfigError as exc:
        raise AlertsConfigError(f"{p}: {exc}") from None
