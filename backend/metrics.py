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


def render(app: Any) -> bytes:
    registry = CollectorRegistry()
    registry.register(WriterCollector(app))
    return generate_latest(registry)
