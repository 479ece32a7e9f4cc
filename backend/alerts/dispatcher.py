"""Alert delivery: webhooks called in the background, with timeouts and retries.

`AlertDispatcher.emit(kind, incident)` is what the engine calls after a commit: it never
blocks and never raises. Each webhook has its own queue and thread, so a webhook that
times out delays no other. A delivery is retried on a connection error, a timeout, 408,
429 and 5xx (exponential backoff with full jitter, `Retry-After` honoured up to 30 s) and
given up after `retries`; any other 4xx fails at once (the receiver refuses this body).

Delivery is at most once, from the replica that emitted it: an alert still queued when
the process dies is lost (and a leader that takes over does not resend what the old one
sent or lost). The outcome of every delivery is logged, counted per webhook and kind
(`stats`, on /metrics) and kept in `recent`.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from trainguard.backend.alerts.config import AlertKind, Webhook, load_webhooks
from trainguard.backend.alerts.payloads import generic_body, slack_body

log = logging.getLogger(__name__)

RETRY_AFTER_MAX_S = 30.0
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 10.0


@dataclass(frozen=True)
class Delivery:
    webhook: str
    kind: str
    incident_id: Any
    ok: bool
    attempts: int
    status: int | None  # the last HTTP status, None when no answer came
    error: str
    at: float
    duration_s: float


@dataclass(frozen=True)
class _Alert:
    kind: str
    body: dict[str, Any]
    incident_id: Any


def kinds_for_change(
    before: str | None, inc: Mapping[str, Any], escalated: bool = False, waiting: bool = False
) -> list[str]:
    """The alerts that an incident's change of status calls for.

    `before` is its status before the transaction (None: it is new); `escalated` says a
    stronger level was chosen within the episode (escalations went up); `waiting` says
    its job just went `waiting` (no schedulable node left)."""
    after = inc.get("status")
    kinds: list[str] = []
    if before is None:
        kinds.append("incident_opened")
    elif escalated:
        kinds.append("escalation")
    if waiting:
        kinds.append("job_waiting")
    if after == "pending" and before != "pending":
        kinds.append("needs_approval")
    if after == "stopped" and before != "stopped":
        kinds.append("stop_job")
    elif after == "resolved" and before != "resolved":
        kinds.append("incident_resolved")
    elif after == "failed" and before != "failed":
        kinds.append("incident_failed")
    return kinds


class AlertDispatcher:
    def __init__(
        self,
        webhooks: Iterable[Webhook],
        *,
        public_url: str | None = None,
        transport: httpx.BaseTransport | None = None,
        queue_max: int = 1000,
        sleep: Callable[[float], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.webhooks = list(webhooks)
        self.public_url = public_url.rstrip("/") if public_url else None
        self._client = httpx.Client(transport=transport, follow_redirects=False)
        self._queues: dict[str, queue.Queue[_Alert | None]] = {
            h.name: queue.Queue(queue_max) for h in self.webhooks
        }
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        # (webhook, kind, outcome) -> count; outcome: sent | failed | dropped
        self.stats: Counter[tuple[str, str, str]] = Counter()
        self.recent: deque[Delivery] = deque(maxlen=100)

    @classmethod
    def from_settings(cls, settings: Any) -> AlertDispatcher:
        """From `alerts_file` and `public_url` (the settings fail fast on a bad file)."""
        return cls(
            load_webhooks(getattr(settings, "alerts_file", None)),
            public_url=getattr(settings, "public_url", None),
        )

    # --- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        for hook in self.webhooks:
            t = threading.Thread(
                target=self._worker, args=(hook,), name=f"tg-alert-{hook.name}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 10.0) -> None:
        """Deliver what is queued within `timeout`, then drop the rest (counted)."""
        deadline = time.monotonic() + timeout
        for q in self._queues.values():
            with contextlib.suppress(queue.Full):
                q.put_nowait(None)
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._stop.set()
        for t in self._threads:
            t.join(1.0)
        self._threads.clear()
        for name, q in self._queues.items():
            while True:
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    self._count(name, item.kind, "dropped")
        self._client.close()

    # --- the engine's interface ---------------------------------------------------------

    def emit(self, kind: AlertKind | str, incident: Mapping[str, Any], detail: str = "") -> int:
        """Queue one alert for every webhook that wants `kind`; returns how many. Never
        blocks, never raises (a full queue drops and counts)."""
        inc = dict(incident)
        url = f"{self.public_url}/#/incidents/{inc.get('id')}" if self.public_url else None
        queued = 0
        for hook in self.webhooks:
            if kind not in hook.events:
                continue
            try:
                body = (
                    slack_body(kind, inc, detail, url)
                    if hook.format == "slack"
                    else generic_body(kind, inc, detail, url)
                )
                self._queues[hook.name].put_nowait(_Alert(kind, body, inc.get("id")))
                queued += 1
            except queue.Full:
                self._count(hook.name, kind, "dropped")
                log.warning("alert %s for webhook %s dropped: queue full", kind, hook.name)
            except Exception:
                log.exception("alert %s for webhook %s could not be built", kind, hook.name)
        return queued

    def incident_changed(
        self,
        before: str | None,
        incident: Mapping[str, Any],
        escalated: bool = False,
        waiting: bool = False,
    ) -> list[str]:
        """Emit what a change of an incident calls for (see `kinds_for_change`)."""
        kinds = kinds_for_change(before, incident, escalated, waiting)
        for kind in kinds:
            self.emit(kind, incident)
        return kinds

    def send_test(self, detail: str = "") -> int:
        return self.emit("test", {"id": None, "job": None}, detail or "webhook configured")

    # --- delivery -----------------------------------------------------------------------

    def _worker(self, hook: Webhook) -> None:
        q = self._queues[hook.name]
        while not self._stop.is_set():
            item = q.get()
            if item is None:
                return
            self.deliver(hook, item.kind, item.body, item.incident_id)

    def deliver(
        self, hook: Webhook, kind: str, body: dict[str, Any], incident_id: Any = None
    ) -> Delivery:
        """POST one body with retries (synchronous: the worker's, or a test's)."""
        t0, started = time.monotonic(), time.time()
        status: int | None = None
        error = ""
        attempts = 0
        headers = {"User-Agent": "trainguard-alerts/1", **hook.headers}
        while True:
            attempts += 1
            wait = 0.0
            try:
                resp = self._client.post(
                    hook.url, json=body, headers=headers, timeout=hook.timeout_s
                )
                status = resp.status_code
                if resp.is_success:
                    error = ""
                    break
                error = f"HTTP {status}: {resp.text[:200].strip()}"
                if status not in (408, 429) and status < 500:
                    break  # the receiver refuses this body: retrying changes nothing
                wait = _retry_after(resp)
            except httpx.TimeoutException:
                status, error = None, f"timed out after {hook.timeout_s:g} s"
            except httpx.HTTPError as exc:
                status, error = None, f"{type(exc).__name__}: {exc}"[:200]
            if attempts > hook.retries or self._stop.is_set():
                break
            backoff = self._rng.uniform(0, min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (attempts - 1)))
            (self._sleep or self._stop.wait)(max(wait, backoff))
        ok = not error
        d = Delivery(
            hook.name,
            kind,
            incident_id,
            ok,
            attempts,
            status,
            error,
            started,
            time.monotonic() - t0,
        )
        self.recent.append(d)
        self._count(hook.name, kind, "sent" if ok else "failed")
        if ok:
            log.info(
                "alert %s sent to %s (%s) in %d attempt(s)", kind, hook.name, hook.where, attempts
            )
        else:
            log.warning(
                "alert %s to %s (%s) failed after %d attempt(s): %s",
                kind,
                hook.name,
                hook.where,
                attempts,
                error,
            )
        return d

    def _count(self, hook: str, kind: str, outcome: str) -> None:
        with self._lock:
            self.stats[(hook, kind, outcome)] += 1


def _retry_after(resp: httpx.Response) -> float:
    raw = resp.headers.get("Retry-After")
    if not raw:
        return 0.0
    try:
        seconds = float(raw)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(raw).timestamp() - time.time()
        except (TypeError, ValueError):
            return 0.0
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S)
