"""The FastAPI application: wiring of settings, database, ingest writer, live bus, routers
and the static UI."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import uvicorn
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field
from sqlalchemy import text
from sqlalchemy.orm import sessionmaker
from starlette.routing import BaseRoute, Match, Mount
from starlette.types import Receive, Scope, Send

from trainguard.backend import auth, db, errors, metrics
from trainguard.backend.alerts.dispatcher import AlertDispatcher
from trainguard.backend.analytics import monitor as analytics
from trainguard.backend.analytics.router import router as analytics_router
from trainguard.backend.auth import TokenCache, ViewerDep
from trainguard.backend.catalog.router import router as catalog_router
from trainguard.backend.cluster import service as cluster_service
from trainguard.backend.cluster.router import router as cluster_router
from trainguard.backend.commands.notifier import Notifier
from trainguard.backend.commands.router import router as commands_router
from trainguard.backend.engine.engine import DecisionEngine
from trainguard.backend.engine.policy import load_policy
from trainguard.backend.engine.router import router as engine_router
from trainguard.backend.incidents.router import router as incidents_router
from trainguard.backend.ingest import router as ingest
from trainguard.backend.ingest.writer import IngestWriter, Stored
from trainguard.backend.jobs.router import router as jobs_router
from trainguard.backend.live.bus import LiveBus
from trainguard.backend.live.pgnotify import PgNotifyBus, bus_for
from trainguard.backend.live.router import router as live_router
from trainguard.backend.replay.router import router as replay_router
from trainguard.backend.retention import Retention, RetentionPolicy
from trainguard.backend.settings import Settings

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
NODES_TICK_S = 2.0
# The server process's collector thresholds (CPython's defaults: 700, 10, 10).
GC_THRESHOLDS = (50_000, 20, 10)


def tune_gc() -> None:
    """For the server process, once the app is built: its long-lived objects (modules,
    classes, the app) move out of the collector's reach, and young collections run every
    50,000 allocations instead of 700.

    With CPython's defaults, each ingest request's objects (futures waiting ~30 ms for the
    group commit) outlived two young collections, were promoted, and set off a full
    collection of ~200k objects every ~10 s at 2,048 nodes: 120-160 ms with the GIL held,
    every request in flight stalled. At agents batching every 4 s, ingest's p99 went from
    2.3-2.8 s to 136-150 ms on PostgreSQL (docs/benchmarks.md, "Ingest")."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class _RedactTokens(logging.Filter):
    """The live stream takes ?access_token=: keep it out of the access log."""

    _pattern = re.compile(r"(access_token=)[^&\s]*")

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                self._pattern.sub(r"\1<redacted>", a) if isinstance(a, str) else a
                for a in record.args
            )
        return True


_ACCESS_LOG = logging.getLogger("uvicorn.access")
if not any(isinstance(f, _RedactTokens) for f in _ACCESS_LOG.filters):
    _ACCESS_LOG.addFilter(_RedactTokens())


class UiMount(Mount):
    """The static UI at `/`, beneath the routes: a path that one of `routes` serves is never
    the UI's, so another method on it gets the route's 405 and `Allow` (`POST` for
    /api/v1/ingest), not the static files' `GET, HEAD`."""

    def __init__(self, directory: Path, routes: list[BaseRoute]) -> None:
        super().__init__("/", StaticFiles(directory=directory, html=True), name="ui")
        self._routes = routes

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and any(
            r is not self and r.matches(scope)[0] is not Match.NONE for r in self._routes
        ):
            return Match.NONE, {}
        return super().matches(scope)


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready", "unavailable"]
    detail: str | None = Field(default=None, description="why not ready (unavailable only)")


_READINESS = {"application/json": {"schema": {"$ref": "#/components/schemas/Readiness"}}}
# Prometheus' text exposition format, as /metrics sends it.
_PROMETHEUS_TEXT = {"text/plain": {"schema": {"type": "string"}}}


def _publish_stored(bus: LiveBus, stored: Stored) -> None:
    for ev in stored.events:
        bus.publish("events", "event", {k: v for k, v in ev.items() if k != "node_id"})
    for batch, _ in stored.batches:
        topic = f"node:{batch.node}"
        if batch.samples and bus.wants(topic):
            bus.publish(topic, "samples", {"node": batch.node, "samples": batch.samples})
        # The job page's live steps: `steps` events on `job:<name>`.
        by_job: dict[str, list[Any]] = {}
        for st in batch.steps:
            by_job.setdefault(st.job, []).append(st)
        for job, steps in by_job.items():
            if bus.wants(f"job:{job}"):
                bus.publish(f"job:{job}", "steps", {"job": job, "node": batch.node, "steps": steps})


class Api(FastAPI):
    """The backend's ASGI app: FastAPI, except that agents' batches are answered before
    FastAPI's own call (ingest.router's module doc). That call asks OpenTelemetry for its
    providers on every request (with none set up, a walk of os.environ each time) and
    passes through Starlette's error middleware: about 20 of 160 us of a batch's handling
    (docs/benchmarks.md). An error the handler does not answer itself goes to the server,
    which logs it and answers 500, as the error middleware did."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if ingest.is_ingest(scope):
            scope["app"] = self
            await ingest.answer(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def begin_shutdown(self) -> None:
        """The server has stopped accepting connections and waits for the open ones: the
        agents' long-polls answer 503 + Retry-After and the live streams end now, instead
        of holding the shutdown until uvicorn cancels them (a 500 and a traceback)."""
        self.state.commands_notifier.close()
        self.state.bus.close()


class Server(uvicorn.Server):
    """uvicorn's server that tells the app when it starts to stop (`Api.begin_shutdown`),
    before it waits for open connections: uvicorn runs the lifespan's shutdown only after
    they closed, too late to end a long-poll."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if isinstance(self.config.app, Api):
            self.config.app.begin_shutdown()
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # uvicorn raises the signal again once it has stopped, so the process dies of it
        # (-15): a server that stopped gracefully on request exits 0, as the supervisor of
        # `--workers N` does.
        self._captured_signals.clear()


def create_app(settings: Settings) -> FastAPI:
    engine = db.make_engine(settings.url)
    sessions = sessionmaker(engine, expire_on_commit=False)
    # PostgreSQL: live updates fan out to every replica with LISTEN/NOTIFY.
    bus = bus_for(settings.url)

    def _after_store(stored: Stored) -> None:
        if decision_engine is not None:
            decision_engine.on_stored(stored)  # only wakes it: never slows ingest
        _publish_stored(bus, stored)

    writer = IngestWriter(
        engine,
        max_delay_s=settings.writer_max_delay_s,
        min_group=settings.writer_min_group_batches,
        on_stored=lambda stored: _after_store(stored),
    )
    notifier = Notifier()
    alerts = AlertDispatcher.from_settings(settings)
    retention = Retention(
        engine,
        RetentionPolicy(
            settings.raw_retention_s,
            settings.rollup_60_retention_s,
            settings.rollup_900_retention_s,
        ),
    )

    async def prune_periodically() -> None:
        while True:
            await asyncio.sleep(settings.retention_interval_s)
            try:
                await asyncio.to_thread(retention.run_once)
            except Exception as exc:  # the database may be down: try next time
                log.warning("retention run failed: %s", exc)

    # The decision engine (docs/engine.md); it decides only while this replica leads.
    decision_engine = (
        DecisionEngine.from_settings(settings, sessions, notifier, bus)
        if settings.engine_enabled
        else None
    )
    analytics_monitor = analytics.from_settings(
        settings,
        sessions,
        publish=lambda ev: bus.publish("events", "event", ev),
        # Straggler flags are written by the engine's leader only (one writer per database).
        is_leader=lambda: decision_engine is None or decision_engine.leadership.is_leader,
        overrides=(
            decision_engine.policy if decision_engine else load_policy(settings.policy_file)
        ).straggler_overrides(),
    )

    async def nodes_snapshot() -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            with sessions() as s:
                r = settings.policy.model.readmission
                return cluster_service.list_nodes(
                    s, settings.node_down_after_s, (r.repair_after, r.repair_window_s)
                )

        return await asyncio.to_thread(read)

    async def nodes_ticker() -> None:
        while True:
            await asyncio.sleep(NODES_TICK_S)
            if bus.wants("nodes"):
                try:
                    bus.publish("nodes", "nodes", await nodes_snapshot())
                except Exception as exc:  # the database may be down: try next tick
                    log.warning("nodes tick failed: %s", exc)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.is_sqlite:
            # The laptop/demo path: the database is created and migrated on first run.
            await asyncio.to_thread(db.upgrade, settings.url)
        loop = asyncio.get_running_loop()
        bus.loop = loop
        if isinstance(bus, PgNotifyBus):
            bus.start()
        notifier.bind(loop)
        writer.start()
        if decision_engine is not None:
            decision_engine.start()
        alerts.start()
        ticker = asyncio.create_task(nodes_ticker())
        pruner = asyncio.create_task(prune_periodically())
        analytics_task = asyncio.create_task(
            analytics.run_periodically(analytics_monitor, settings.analytics_interval_s)
        )
        try:
            yield
        finally:
            ticker.cancel()
            pruner.cancel()
            analytics_task.cancel()
            if decision_engine is not None:
                await asyncio.to_thread(decision_engine.stop)  # releases the lock
            await asyncio.to_thread(writer.stop)  # drain in-flight ingest
            await asyncio.to_thread(alerts.stop, 5.0)
            if isinstance(bus, PgNotifyBus):
                await asyncio.to_thread(bus.stop)
            engine.dispose()

    app = Api(
        title="trainguard",
        version="0.1.0",
        summary="Control plane for large distributed PyTorch training jobs",
        lifespan=lifespan,
        # FastAPI's /docs and /redoc load their scripts from a CDN: no third-party script on
        # the dashboard's origin, and nothing that fails on an air-gapped cluster. The
        # machine-readable document stays at /openapi.json.
        docs_url=None,
        redoc_url=None,
        # A body without a Content-Type is read as JSON, as ingest and acks read it; any
        # other type than JSON is a 415 (errors.unreadable_body).
        strict_content_type=False,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessions = sessions
    app.state.writer = writer
    app.state.bus = bus
    app.state.token_cache = TokenCache()
    app.state.commands_notifier = notifier
    app.state.decision_engine = decision_engine
    app.state.alerts = alerts
    if decision_engine is not None:
        decision_engine.alerts = alerts
    app.state.nodes_snapshot = nodes_snapshot
    app.state.analytics = analytics_monitor
    app.state.straggler_config = analytics_monitor.cfg
    errors.install(app)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        refused = errors.unreadable_body(exc, request.headers.get("content-type"))
        if refused is not None:
            return refused
        errs = exc.errors()[:10]
        msgs = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errs]
        # `ctx` can hold the validator's exception object: keep only JSON-safe fields.
        safe = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in errs]
        return JSONResponse({"detail": "; ".join(msgs), "errors": safe}, 422)

    def openapi() -> dict[str, Any]:
        """FastAPI's document, with the one error body this app really sends (see
        _validation and errors.install) also under FastAPI's name for its 422."""
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            body = errors.ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, definition in body.pop("$defs", {}).items():
                schemas.setdefault(name, definition)
            schemas["ErrorBody"] = dict(body)
            schemas["HTTPValidationError"] = {**body, "title": "HTTPValidationError"}
            schemas.pop("ValidationError", None)
            schemas.setdefault(
                "Readiness",
                Readiness.model_json_schema(ref_template="#/components/schemas/{model}"),
            )
            errors.document_unparsable_bodies(doc)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI documents replacing app.openapi

    api = APIRouter(prefix=API_PREFIX)
    api.include_router(ingest.router)
    api.include_router(cluster_router)
    api.include_router(jobs_router)
    api.include_router(commands_router)
    api.include_router(incidents_router)
    api.include_router(engine_router)
    api.include_router(replay_router)
    api.include_router(live_router)
    api.include_router(analytics_router)
    api.include_router(catalog_router)
    api.include_router(auth.router)
    app.include_router(api)

    @app.get("/healthz", tags=["ops"], summary="Liveness")
    def healthz() -> Health:
        return Health(status="ok")

    @app.get(
        "/readyz",
        tags=["ops"],
        summary="Readiness: the database answers",
        response_class=JSONResponse,
        responses={
            200: {"description": "ready", "content": _READINESS},
            503: {"description": "the database does not answer", "content": _READINESS},
        },
    )
    def readyz() -> JSONResponse:
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as exc:
            return JSONResponse({"status": "unavailable", "detail": str(exc)[:200]}, 503)
        return JSONResponse({"status": "ready"})

    @app.get(
        "/metrics",
        tags=["ops"],
        summary="Prometheus metrics (viewer token)",
        response_class=PlainTextResponse,
        responses={
            200: {
                "description": "Prometheus text exposition format (version 0.0.4)",
                "content": _PROMETHEUS_TEXT,
            },
            **errors.responses(*errors.VIEWER),
        },
    )
    def prometheus(_: ViewerDep) -> Response:
        return Response(metrics.render(app), media_type="text/plain; version=0.0.4")

    if settings.frontend_dir.is_dir():
        app.router.routes.append(UiMount(settings.frontend_dir, app.router.routes))
    return app
