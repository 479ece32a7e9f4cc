"""/metrics for Prometheus: ingest counters, goodput and stragglers, incidents and
restarts, engine leadership, live fan-out and alert deliveries (docs/deploy.md lists
them; deploy/grafana/ draws them)."""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from trainguard.backend.models import Incident
from trainguard.backend.models.control import ACTIVE_STATUSES, INCIDENT_STATUSES


class WriterCollector(Collector):
    def __init__(self, app: Any) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        stats = self.app.state.writer.stats
        for key, help_ in (
            ("batches", "ingest batches stored"),
            ("duplicates", "replayed ingest batches dropped"),
            ("samples", "GPU samples stored"),
            ("transactions", "ingest group-commit transactions"),
            ("failed", "ingest batches failed (database errors)"),
            ("yielded", "SQLite: ingest commits after which a waiting write went first"),
        ):
            c = CounterMetricFamily(f"trainguard_ingest_{key}", help_)
            c.add_metric([], stats[key])
            yield c
        writer = self.app.state.writer
        for name, help_, value in (
            ("queued_batches", "ingest batches waiting for the writer", writer.queued()),
            (
                "queue_wait_seconds",
                "how long the oldest batch waiting for the writer has waited",
                writer.queue_wait_s(),
            ),
        ):
            g = GaugeMetricFamily(f"trainguard_ingest_{name}", help_)
            g.add_metric([], value)
            yield g
        g = GaugeMetricFamily("trainguard_live_subscribers", "open SSE streams")
        g.add_metric([], len(self.app.state.bus._subs))
        yield g


class AnalyticsCollector(Collector):
    """Goodput and straggler gauges, from the analytics monitor's last refresh."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        monitor = getattr(self.app.state, "analytics", None)
        gauges = monitor.gauges if monitor is not None else {}
        counts = monitor.stragglers if monitor is not None else {}
        ratio = GaugeMetricFamily(
            "trainguard_job_goodput_ratio",
            "productive step time / elapsed time over the whole run",
            labels=["job"],
        )
        stragglers = GaugeMetricFamily(
            "trainguard_job_stragglers", "ranks flagged as stragglers", labels=["job"]
        )
        badput = GaugeMetricFamily(
            "trainguard_job_badput_seconds",
            "time lost over the whole run, by bucket",
            labels=["job", "bucket"],
        )
        for job, g in sorted(gauges.items()):
            if g["goodput"] is not None:
                ratio.add_metric([job], g["goodput"])
            for bucket, seconds in g["badput"].items():
                badput.add_metric([job, bucket], seconds)
        for job, n in sorted(counts.items()):
            stragglers.add_metric([job], n)
        yield ratio
        yield stragglers
        yield badput


class ControlCollector(Collector):
    """Incidents and restarts (cluster-wide, from the database: every replica reports the
    same numbers, so take max() across replicas), and this replica's engine leadership,
    live fan-out and alert deliveries. Database reads are cached for CACHE_S."""

    CACHE_S = 5.0

    def __init__(self, app: Any) -> None:
        self.app = app

    def _from_db(self) -> tuple[dict[str, int], dict[tuple[str, str, str], int]]:
        cached = getattr(self.app.state, "metrics_db_cache", None)
        now = time.monotonic()
        if cached is not None and now - cached[0] < self.CACHE_S:
            return cached[1], cached[2]
        with self.app.state.sessions() as s:
            statuses = dict(
                s.execute(select(Incident.status, func.count()).group_by(Incident.status)).all()
            )
            restarts: Counter[tuple[str, str, str]] = Counter()
            for cause, trigger, decisions in s.execute(
                select(Incident.cause, Incident.trigger, Incident.decisions)
            ):
                for d in decisions or ():
                    if d.get("restart"):
                        restarts[(str(d.get("level")), cause, trigger)] += 1
        self.app.state.metrics_db_cache = (now, statuses, restarts)
        return statuses, restarts

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "trainguard_database_up", "1 when this replica could read the database for /metrics"
        )
        try:
            statuses, restarts = self._from_db()
        except Exception:
            statuses, restarts = None, None
        up.add_metric([], 0.0 if statuses is None else 1.0)
        yield up
        if statuses is not None and restarts is not None:
            g = GaugeMetricFamily("trainguard_incidents", "incidents by status", labels=["status"])
            for status in INCIDENT_STATUSES:
                g.add_metric([status], statuses.get(status, 0))
            yield g
            g = GaugeMetricFamily(
                "trainguard_open_incidents", "incidents being handled or awaiting approval"
            )
            g.add_metric([], sum(statuses.get(st, 0) for st in ACTIVE_STATUSES))
            yield g
            c = CounterMetricFamily(
                "trainguard_restarts",
                "restart actions taken (escalations count once per level), by level and cause",
                labels=["level", "cause", "trigger"],
            )
            for (level, cause, trigger), n in sorted(restarts.items()):
                c.add_metric([level, cause, trigger], n)
            yield c
        yield from self._engine()
        yield from self._fanout()
        yield from self._alerts()

    def _engine(self) -> Iterator[Metric]:
        engine = getattr(self.app.state, "decision_engine", None)
        replica = f"{socket.gethostname()}:{os.getpid()}"
        leader = GaugeMetricFamily(
            "trainguard_engine_leader",
            "1 on the replica whose decision engine leads (holds the advisory lock)",
            labels=["replica"],
        )
        leader.add_metric(
            [replica], 1.0 if engine is not None and engine.leadership.is_leader else 0.0
        )
        yield leader
        if engine is None:
            return
        since = getattr(engine.leadership, "acquired_at", None)
        if since is not None:
            g = GaugeMetricFamily(
                "trainguard_engine_leader_since_seconds", "when this replica became leader"
            )
            g.add_metric([], since)
            yield g
        for key, help_, value in (
            ("cycles", "decision cycles run while leading", engine.cycles),
            ("errors", "decision cycles that failed", engine.errors),
        ):
            c = CounterMetricFamily(f"trainguard_engine_{key}", help_)
            c.add_metric([], value)
            yield c
        c = CounterMetricFamily(
            "trainguard_engine_outcomes",
            "what the engine did with evidence on this replica, by outcome",
            labels=["outcome"],
        )
        for key, n in sorted(dict(engine.decider.stats).items()):
            c.add_metric([key], n)
        yield c

    def _fanout(self) -> Iterator[Metric]:
        stats = getattr(getattr(self.app.state, "bus", None), "stats", None)
        if stats is None:
            return
        for key, help_ in (
            ("sent", "live notifications sent to the other replicas"),
            ("received", "live messages received from the other replicas"),
            ("dropped", "live messages not sent (queue full, database errors)"),
            ("errors", "LISTEN/NOTIFY errors"),
        ):
            c = CounterMetricFamily(f"trainguard_live_fanout_{key}", help_)
            c.add_metric([], getattr(stats, key))
            yield c
        g = GaugeMetricFamily(
            "trainguard_live_remote_topics", "live topics the other replicas subscribe to"
        )
        g.add_metric([], stats.remote_topics)
        yield g

    def _alerts(self) -> Iterator[Metric]:
        alerts = getattr(self.app.state, "alerts", None)
        if alerts is None:
            return
        c = CounterMetricFamily(
            "trainguard_alerts",
            "alert deliveries by webhook, kind and outcome (sent, failed, dropped)",
            labels=["webhook", "kind", "outcome"],
        )
        for (hook, kind, outcome), n in sorted(dict(alerts.stats).items()):
            c.add_metric([hook, kind, outcome], n)
        yield c


def render(app: Any) -> bytes:
    registry = CollectorRegistry()
    registry.register(WriterCollector(app))
    registry.register(AnalyticsCollector(app))
    registry.register(ControlCollector(app))
    return generate_latest(registry)
