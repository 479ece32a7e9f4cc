"""The replay tests record their periods on the engine tests' simulated cluster (real
app, real ingest, a decision engine on a settable clock)."""

from tests.backend.engine.conftest import make_cluster  # noqa: F401  # the fixture, shared
