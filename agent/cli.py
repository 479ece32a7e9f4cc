"""The one CLI, `trainguard`. Commands import their part lazily, so a GPU node with only
the `agent` extra never imports the server's dependencies.

User mistakes print one line and exit non-zero, never a traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

app = typer.Typer(
    name="trainguard",
    help="Keeps large distributed PyTorch training jobs running.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
db_app = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)
app.add_typer(db_app, name="db")
token_app = typer.Typer(help="API tokens with roles (stored hashed).", no_args_is_help=True)
app.add_typer(token_app, name="token")
bench_app = typer.Typer(help="Benchmarks (results go to docs/benchmarks.md).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


# Options several commands share.
DbUrlOpt = Annotated[
    str | None, typer.Option(envvar="TRAINGUARD_DATABASE_URL", help="SQLAlchemy URL")
]
DataDirOpt = Annotated[
    Path | None, typer.Option(envvar="TRAINGUARD_DATA_DIR", help="SQLite and state folder")
]


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"trainguard: {message}", err=True)
    raise typer.Exit(code)


def _settings(**overrides: object):  # type: ignore[no-untyped-def]
    from pydantic import ValidationError

    from trainguard.backend.settings import Settings

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        fail(
            f"bad setting{' ' + where if where else ''}: {err['msg'].removeprefix('Value error, ')}"
        )


@app.command()
def server(
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
    database_url: DbUrlOpt = None,
    data_dir: DataDirOpt = None,
    log_level: Annotated[str, typer.Option()] = "info",
    log_format: Annotated[
        str, typer.Option(envvar="TRAINGUARD_LOG_FORMAT", help="text | json (one object a line)")
    ] = "text",
) -> None:
    """Run the backend (API, ingest, live stream, dashboard at /)."""
    import uvicorn

    from trainguard.backend.app import create_app, tune_gc
    from trainguard.backend.logs import uvicorn_log_config

    if log_format not in ("text", "json"):
        fail(f"--log-format must be text or json, not {log_format!r}")

    settings = _settings(database_url=database_url, data_dir=data_dir)
    if not settings.admin_token and not settings.demo and not _has_tokens(settings.url):
        fail(
            "no token configured: set TRAINGUARD_ADMIN_TOKEN (>= 16 chars), create one with "
            "`trainguard token create`, or run `trainguard demo`"
        )
    api = create_app(settings)
    if settings.gc_tuning:
        tune_gc()
    # Open SSE streams would hold a shutdown forever: give connections 3 s to finish.
    uvicorn.run(
        api,
        host=host,
        port=port,
        log_level=log_level,
        log_config=uvicorn_log_config(log_format, log_level),  # type: ignore[arg-type]
        timeout_graceful_shutdown=3,
        # Agents keep one connection and send every agent_batch_interval_s: an idle
        # timeout shorter than that closes it between batches (a failed send, a new TCP
        # and TLS handshake each time).
        timeout_keep_alive=int(max(5.0, 2 * settings.agent_batch_interval_s + 5)),
    )


@app.command()
def agent(
    server: Annotated[
        str | None, typer.Option(envvar="TRAINGUARD_AGENT_SERVER", help="backend URL")
    ] = None,
    token: Annotated[
        str | None, typer.Option(envvar="TRAINGUARD_AGENT_TOKEN", help="agent token")
    ] = None,
    node: Annotated[str | None, typer.Option(help="node name (default: hostname)")] = None,
    simulate: Annotated[
        int | None, typer.Option(min=1, max=64, help="N simulated GPUs instead of NVML")
    ] = None,
    interval: Annotated[float | None, typer.Option(help="sampling period in seconds")] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="serve Prometheus metrics on this port (9401)"),
    ] = None,
    socket: Annotated[
        Path | None,
        typer.Option(
            help="SDK socket (default: /run/trainguard/agent.sock as root, else "
            "$XDG_RUNTIME_DIR/trainguard/ or /tmp/trainguard-<uid>/; the SDK finds these "
            "with no setting). Elsewhere, give the ranks TRAINGUARD_AGENT_SOCKET too"
        ),
    ] = None,
) -> None:
    """Run the node agent: GPU health, XIDs, rank heartbeats and steps -> backend."""
    from pydantic import ValidationError

    from trainguard.agent.config import AgentConfig
    from trainguard.agent.daemon import main as agent_main

    fields = {
        "server": server,
        "token": token,
        "node": node,
        "simulate": simulate,
        "interval": interval,
        "metrics_port": metrics_port,
        "socket_path": socket,
    }
    try:
        cfg = AgentConfig(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        fail(f"bad agent setting {'.'.join(str(p) for p in err['loc'])}: {err['msg']}")
    if not cfg.token:
        fail("no agent token: --token, TRAINGUARD_AGENT_TOKEN or `token` in the config file")
    raise typer.Exit(agent_main(cfg, setup=_add_local_components))


def _add_local_components(agent_obj) -> None:  # type: ignore[no-untyped-def]
    """The SDK socket server (ranks, steps, heartbeats) and the command executor."""
    from trainguard.agent.executor import CommandLoop
    from trainguard.agent.local import LocalServer

    try:
        local = LocalServer(agent_obj)
    except OSError as exc:  # no well-known place for the SDK socket is usable
        fail(f"agent: {exc}")
    agent_obj.add_component(local)
    agent_obj.add_component(CommandLoop(agent_obj, local))
    if agent_obj.config.store_port:
        from trainguard.agent.storehost import StoreHost

        agent_obj.add_component(StoreHost(agent_obj.config.store_port, agent_obj.config.store_host))
    if agent_obj.config.metrics_port is not None:
        from trainguard.agent.metrics import AgentExporter

        cfg = agent_obj.config
        agent_obj.add_component(AgentExporter(agent_obj, cfg.metrics_port, cfg.metrics_host))


@app.command()
def demo(
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    data_dir: Annotated[Path, typer.Option(help="demo state (wiped at start)")] = Path("data/demo"),
    nodes: Annotated[int, typer.Option(min=1, max=64, help="simulated nodes")] = 2,
    gpus: Annotated[int, typer.Option(min=1, max=16, help="simulated GPUs per node")] = 2,
    job: Annotated[bool, typer.Option(help="run the demo training job with seeded faults")] = True,
) -> None:
    """Backend (SQLite) + simulated agents + a small training job; dashboard on localhost."""
    from trainguard.backend.demo import run_demo

    raise typer.Exit(
        run_demo(host=host, port=port, data_dir=data_dir, nodes=nodes, gpus=gpus, with_job=job)
    )


@db_app.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Argument()] = "head",
    database_url: DbUrlOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Apply the migrations up to REVISION (default: head)."""
    from trainguard.backend import db

    settings = _settings(database_url=database_url, data_dir=data_dir)
    _run_migration(lambda: db.upgrade(settings.url, revision), settings.url)
    typer.echo(f"database at {revision}")


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="target revision, e.g. -1 or base")],
    database_url: DbUrlOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Revert the migrations down to REVISION."""
    from trainguard.backend import db

    settings = _settings(database_url=database_url, data_dir=data_dir)
    _run_migration(lambda: db.downgrade(settings.url, revision), settings.url)
    typer.echo(f"database at {revision}")


@bench_app.command("ingest")
def bench_ingest(
    nodes: Annotated[int, typer.Option(min=1, help="simulated nodes")] = 256,
    gpus: Annotated[int, typer.Option(min=1, max=64, help="GPUs per node")] = 8,
    duration: Annotated[float, typer.Option(min=1, help="seconds of load")] = 30,
    period: Annotated[float, typer.Option(min=0.01, help="seconds between a GPU's samples")] = 1,
    batch_interval: Annotated[
        float | None,
        typer.Option(min=0.01, help="seconds between a node's batches (default: --period)"),
    ] = None,
    workers: Annotated[int, typer.Option(min=1, max=64, help="load generator processes")] = 1,
    database_url: DbUrlOpt = None,
    data_dir: Annotated[Path, typer.Option()] = Path("data/bench"),
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8311,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result here")] = None,
) -> None:
    """Sustained end-to-end ingest: load generators -> HTTP -> one backend -> database."""
    from trainguard.backend.bench.ingest import run

    _print_report(
        run(
            nodes,
            gpus,
            duration,
            period,
            workers,
            database_url,
            data_dir,
            port,
            json_out,
            batch_interval=batch_interval,
        )
    )


@bench_app.command("stragglers")
def bench_stragglers(
    ranks: Annotated[int, typer.Option(min=2)] = 16384,
    window_steps: Annotated[int, typer.Option(min=2)] = 20,
    windows: Annotated[int, typer.Option(min=1)] = 8,
    slow_fraction: Annotated[float, typer.Option(min=0, max=1)] = 0.01,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Straggler scoring cost per window for N ranks (target < 100 ms on one core)."""
    from trainguard.backend.bench.stragglers import run

    _print_report(
        run(
            ranks=ranks,
            window_steps=window_steps,
            windows=windows,
            slow_fraction=slow_fraction,
            seed=seed,
        )
    )


@bench_app.command("decision")
def bench_decision(
    events: Annotated[int, typer.Option(min=1, help="evidence events to time")] = 200,
    interval: Annotated[float, typer.Option(min=0, help="seconds between events")] = 0.1,
    database_url: DbUrlOpt = None,
    data_dir: Annotated[Path, typer.Option()] = Path("data/bench-decision"),
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8313,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result here")] = None,
    load_nodes: Annotated[
        int, typer.Option(min=0, help="8-GPU nodes of ingest load meanwhile (0: none)")
    ] = 0,
    load_batch_interval: Annotated[
        float, typer.Option(min=0.5, max=30, help="seconds between a load node's batches")
    ] = 4.0,
) -> None:
    """Evidence arrival -> decision -> command acked by a real agent, p50/p99."""
    from trainguard.backend.bench.decision import run

    try:
        report = run(
            events=events,
            interval=interval,
            database_url=database_url,
            data_dir=data_dir,
            port=port,
            out_json=json_out,
            load_nodes=load_nodes,
            load_batch_interval=load_batch_interval,
        )
    except RuntimeError as exc:  # the ingest load did not run: no result
        fail(str(exc))
    _print_report(report)


@bench_app.command("recovery")
def bench_recovery(
    modes: Annotated[
        str,
        typer.Option(
            help="comma-separated: baseline,launcher,in_process (one fault kind each); "
            "mixed_baseline,mixed_launcher,mixed_nvrx,engine,engine_after_nvrx (mixed kinds)"
        ),
    ] = "baseline,launcher,in_process",
    faults: Annotated[int, typer.Option(min=1, max=50)] = 5,
    seed: Annotated[int, typer.Option()] = 42,
    after_step: Annotated[int, typer.Option(min=1)] = 10,
    steps: Annotated[int, typer.Option(min=20)] = 300,
) -> None:
    """The AWS NVRx experiment on CPU: full restart vs launcher vs in-process, same faults."""
    from trainguard.backend.bench.recovery import ALL_MODES, run, table

    wanted = tuple(m.strip() for m in modes.split(",") if m.strip())
    bad = [m for m in wanted if m not in ALL_MODES]
    if bad or not wanted:
        fail(f"--modes takes {', '.join(ALL_MODES)}; not {', '.join(bad) or 'nothing'}")
    typer.echo(
        table(run(modes=wanted, faults=faults, seed=seed, after_step=after_step, steps=steps))
    )


@bench_app.command("chaos")
def bench_chaos(
    minutes: Annotated[str, typer.Option(metavar="M", help="minutes of faults")] = "10",
    seed: Annotated[
        str, typer.Option(metavar="S", help="seeds the faults and agent deaths")
    ] = "42",
    out: Annotated[Path | None, typer.Option(help="write the JSON report here")] = None,
    agent_every: Annotated[
        str, typer.Option(metavar="SECONDS", help="mean time between agent deaths (0: none)")
    ] = "90",
    steps: Annotated[str, typer.Option(metavar="N", help="steps per job run")] = "800",
    faults_per_run: Annotated[str, typer.Option(metavar="N", help="faults per job run")] = "5",
    policy: Annotated[
        Path | None, typer.Option(help="a policy TOML for the server (default: its defaults)")
    ] = None,
    workdir: Annotated[Path | None, typer.Option(help="keep the run's files here")] = None,
) -> None:
    """The demo job under mixed seeded faults (exception, SIGKILL, hang, XID 79, agent
    death) against a real server for M minutes: incidents, wrongful actions, recovery."""
    from trainguard.backend.bench.chaos import ChaosError, parse_config, run
    from trainguard.backend.bench.chaos_report import table

    try:
        cfg = parse_config(minutes, seed, agent_every, steps, faults_per_run)
        if policy is not None:
            if not policy.is_file():
                raise ChaosError(f"--policy: no file {policy}")
            cfg.policy = str(policy.resolve())
        report = run(cfg, workdir=workdir, out=out)
    except ChaosError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail("interrupted before the report; every process it started was stopped", 130)
    typer.echo(table(report))
    if report["interrupted"]:
        raise typer.Exit(130)


@bench_app.command("checkpoint")
def bench_checkpoint(
    intervals: Annotated[str, typer.Option(help="comma-separated checkpoint intervals")] = "10,50",
    steps: Annotated[int, typer.Option(min=20)] = 300,
    modes: Annotated[str, typer.Option(help="comma-separated save modes")] = "",
    advice: Annotated[
        bool, typer.Option(help="also run the async modes at the advised interval")
    ] = True,
    mtbf_h: Annotated[
        float, typer.Option(min=0.0, help="MTBF for the advice, hours (0: Llama 3's job)")
    ] = 0.0,
    repeats: Annotated[int, typer.Option(min=1, max=10)] = 2,
) -> None:
    """Training with no checkpoint vs torch.save vs DCP save vs DCP async_save (and its
    staged variant), then the async modes at the interval the advice recommends."""
    from trainguard.backend.bench.checkpoint import (
        ALL_SAVE_MODES,
        DEFAULT_MTBF_S,
        SAVE_MODES,
        run,
        table,
    )

    try:
        every = tuple(int(x) for x in intervals.split(",") if x.strip())
    except ValueError:
        fail(f"--intervals takes integers like 10,50, not {intervals!r}")
    if not every or min(every) < 1:
        fail("--intervals needs positive integers")
    wanted = tuple(m.strip() for m in modes.split(",") if m.strip()) or SAVE_MODES
    bad = [m for m in wanted if m not in ALL_SAVE_MODES]
    if bad:
        fail(f"--modes takes {', '.join(ALL_SAVE_MODES)}; not {', '.join(bad)}")
    result = run(
        intervals=every,
        steps=steps,
        modes=wanted,
        advice_runs=advice,
        mtbf_s=mtbf_h * 3600 if mtbf_h else DEFAULT_MTBF_S,
        repeats=repeats,
    )
    typer.echo(table(result))


@bench_app.command("soak")
def bench_soak(
    minutes: Annotated[float, typer.Option(min=0.1)] = 10,
    nodes: Annotated[int, typer.Option(min=0, help="simulated nodes of the load generator")] = 256,
    agents: Annotated[int, typer.Option(min=0, max=64, help="real agent processes")] = 4,
    gpus: Annotated[int, typer.Option(min=1, max=64)] = 8,
    period: Annotated[float, typer.Option(min=0.01)] = 1,
    workers: Annotated[int, typer.Option(min=1, max=64)] = 1,
    every: Annotated[float, typer.Option(min=0.5, help="seconds between RSS readings")] = 10,
    database_url: DbUrlOpt = None,
    data_dir: Annotated[Path, typer.Option()] = Path("data/soak"),
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8316,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result here")] = None,
) -> None:
    """Memory over a sustained ingest run: backend and agent RSS at start, middle, end."""
    from trainguard.backend.bench.soak import run

    _print_report(
        run(
            minutes,
            nodes,
            agents,
            gpus,
            period,
            workers,
            database_url,
            data_dir,
            port,
            every_s=every,
            json_out=json_out,
        )
    )


@bench_app.command("agent")
def bench_agent(
    duration: Annotated[float, typer.Option(min=5, help="seconds measured")] = 60,
    gpus: Annotated[int, typer.Option(min=1, max=64)] = 8,
    ranks: Annotated[int, typer.Option(min=1, max=64)] = 8,
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8312,
    sdk_flush_s: Annotated[
        float | None,
        typer.Option(min=0.01, max=10, help="ranks' SDK flush interval; default: the SDK's"),
    ] = None,
) -> None:
    """Agent CPU and RSS with simulated GPUs and SDK ranks; the SDK step-hook cost."""
    from trainguard.backend.bench.agent import run

    _print_report(
        run(duration=duration, gpus=gpus, ranks=ranks, port=port, sdk_flush_s=sdk_flush_s)
    )


@bench_app.command("retention")
def bench_retention(
    gpus: Annotated[int, typer.Option(min=1, max=4096, help="GPUs measured (8 a node)")] = 8,
    days: Annotated[float, typer.Option(min=0.1, max=365, help="simulated days")] = 30,
    period: Annotated[float, typer.Option(min=0.1, help="seconds between samples")] = 1,
    old_period: Annotated[
        float, typer.Option(help="seconds between samples older than --dense-hours")
    ] = 60,
    dense_hours: Annotated[
        float | None, typer.Option(min=0, help="hours at --period; default 2 raw windows")
    ] = None,
    raw_hours: Annotated[float, typer.Option(min=0.01, help="raw window")] = 6,
    rollup_60_days: Annotated[float, typer.Option(min=0.01, help="60 s rollups kept")] = 7,
    rollup_900_days: Annotated[float, typer.Option(min=0.01, help="900 s rollups kept")] = 90,
    cluster_gpus: Annotated[int, typer.Option(min=1, help="GPUs extrapolated to")] = 16384,
    requests: Annotated[int, typer.Option(min=0, help="timed requests per read; 0: none")] = 30,
    database_url: DbUrlOpt = None,
    data_dir: Annotated[Path, typer.Option()] = Path("data/bench-retention"),
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8317,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result here")] = None,
) -> None:
    """Database size per retention tier over simulated days, extrapolated to a cluster;
    latency of the node page's chart reads over it."""
    from trainguard.backend.bench.retention import BenchError, run, table
    from trainguard.backend.retention import RetentionPolicy

    if old_period < period:
        fail("--old-period must be at least --period")
    if not raw_hours * 3600 < rollup_60_days * 86400 < rollup_900_days * 86400:
        fail("retention must grow: --raw-hours < --rollup-60-days < --rollup-900-days")
    policy = RetentionPolicy(raw_hours * 3600, rollup_60_days * 86400, rollup_900_days * 86400)
    try:
        result = run(
            gpus=gpus,
            days=days,
            period=period,
            old_period=old_period,
            dense_s=None if dense_hours is None else dense_hours * 3600,
            cluster_gpus=cluster_gpus,
            requests=requests,
            policy=policy,
            database_url=database_url,
            data_dir=data_dir,
            port=port,
            json_out=json_out,
        )
    except BenchError as exc:
        fail(str(exc))
    typer.echo(table(result))


def _print_report(report: dict) -> None:  # type: ignore[type-arg]
    width = max(len(k) for k in report)
    for k, v in report.items():
        typer.echo(f"{k:<{width}}  {v}")


def _has_tokens(url: str) -> bool:
    from sqlalchemy import inspect
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm import Session

    from trainguard.backend import db
    from trainguard.backend.tokens.service import any_live

    if url.startswith("sqlite") and not Path(url.split("///", 1)[-1]).exists():
        return False
    engine = db.make_engine(url)
    try:
        if not inspect(engine).has_table("api_tokens"):
            return False
        with Session(engine) as session:
            return any_live(session)
    except OperationalError as exc:
        fail(f"cannot reach the database at {_redact(url)}: {str(exc.orig).strip()[:200]}")
    finally:
        engine.dispose()


def _token_session(database_url: str | None, data_dir: Path | None):  # type: ignore[no-untyped-def]
    from sqlalchemy.orm import Session

    from trainguard.backend import db

    settings = _settings(database_url=database_url, data_dir=data_dir)
    _run_migration(lambda: db.upgrade(settings.url), settings.url)
    return Session(db.make_engine(settings.url))


@token_app.command("create")
def token_create(
    role: Annotated[str, typer.Option(help="agent | viewer | operator")],
    node: Annotated[str | None, typer.Option(help="the node an agent token is bound to")] = None,
    name: Annotated[str, typer.Option(help="a label for listings")] = "",
    database_url: DbUrlOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Create a token and print it once (it is stored only as a hash)."""
    from trainguard.backend.errors import DomainError
    from trainguard.backend.tokens import service

    with _token_session(database_url, data_dir) as session:
        try:
            created = service.create(session, role, name, node)
        except DomainError as exc:
            fail(exc.message)
        session.commit()
    typer.echo(created.token)
    typer.echo(
        f"token {created.id}: role {created.role}"
        f"{' bound to node ' + created.node if created.node else ''}; shown once, store it now",
        err=True,
    )


@token_app.command("list")
def token_list(
    database_url: DbUrlOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """List tokens (id, role, node, prefix; never the token)."""
    from trainguard.backend.tokens import service

    with _token_session(database_url, data_dir) as session:
        for t in service.list_tokens(session):
            state = "revoked" if t["revoked"] else "active"
            typer.echo(
                f"{t['id']:>4}  {t['role']:<8}  {t['node'] or '-':<20}  "
                f"{t['prefix']}...  {t['name']}  {state}"
            )


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[int, typer.Argument(help="id from `trainguard token list`")],
    database_url: DbUrlOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Revoke a token (takes effect within a few seconds on every replica)."""
    from trainguard.backend.errors import DomainError
    from trainguard.backend.tokens import service

    with _token_session(database_url, data_dir) as session:
        try:
            service.revoke(session, token_id)
        except DomainError as exc:
            fail(exc.message)
        session.commit()
    typer.echo(f"token {token_id} revoked")


def _run_migration(fn, url: str) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy.exc import OperationalError

    try:
        fn()
    except OperationalError as exc:
        fail(
            f"cannot reach the database at {_redact(url)}: {str(exc.orig).strip().splitlines()[0]}"
        )


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable url>"


def main() -> None:  # pragma: no cover - console entry
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
