"""/metrics for Prometheus: the backend's own counters (the production issue adds the
fleet gauges)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class WriterCollector(Collector):
    def __init__(self, app: Any) -> None:
        self.app = app

    def collect(self):  # type: ignore[no-untyped-def]
        stats = self.app.state.writer.stats
        for key, help_ in (
            ("batches", "ingest batches stored"),
            ("duplicates", "replayed ingest batches dropped"),
            ("samples", "GPU samples stored"),
            ("transactions", "ingest group-commit transactions"),
            ("failed", "ingest batches failed (database errors)"),
        ):
            c = CounterMetricFamily(f"trainguard_ingest_{key}", help_)
            c.add_metric([], stats[key])
            yield c
        g = GaugeMetricFamily("trainguard_live_subscribers", "open SSE streams")
        g.add_metric([], len(self.app.state.bus._subs))
        yield g


class AnalyticsCollector(Collector):
    """Goodput and straggler gauges, from the analytics monitor's last refresh."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def collect(self):  # type: ignore[no-untyped-def]
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


def render(app: Any) -> bytes:
    registry = CollectorRegistry()
    registry.register(WriterCollector(app))
    registry.register(AnalyticsCollector(app))
    return generate_latest(registry)
