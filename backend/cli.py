"""The backend's commands under `trainguard`: server, demo, db, token.

The root CLI (agent/cli.py) finds them through the `trainguard.commands` entry points
(pyproject.toml). This module imports typer and nothing of the server, so listing the
commands costs an agent nothing; each command imports its part when it runs, after
checking that the `server` extra is installed (an agent-only install has the commands but
not their dependencies: one line, exit 2).

User mistakes print one line and exit non-zero, never a traceback.
"""

from __future__ import annotations

import importlib.util
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:  # the server's modules load only when a command runs
    from collections.abc import Callable

    from sqlalchemy.orm import Session

    from trainguard.backend.settings import Settings

# The modules of the `server` extra that these commands import (pyproject.toml).
SERVER_MODULES = ("fastapi", "uvicorn", "sqlalchemy", "alembic")

db_app = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)
token_app = typer.Typer(help="API tokens with roles (stored hashed).", no_args_is_help=True)

# Options several commands share (the bench commands too).
DbUrlOpt = Annotated[
    str | None, typer.Option(envvar="TRAINGUARD_DATABASE_URL", help="SQLAlchemy URL")
]
DataDirOpt = Annotated[
    Path | None, typer.Option(envvar="TRAINGUARD_DATA_DIR", help="SQLite and state folder")
]


class DemoLauncher(StrEnum):
    """The launchers the demo job can run under."""

    ft_launcher = "ft_launcher"
    torchrun = "torchrun"


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"trainguard: {message}", err=True)
    raise typer.Exit(code)


def missing_server_modules() -> list[str]:
    return [m for m in SERVER_MODULES if importlib.util.find_spec(m) is None]


def need_server_extra(command: str) -> None:
    """One line and exit 2 when this install lacks the `server` extra (an agent node)."""
    if missing_server_modules():
        typer.echo(
            f"trainguard {command} needs the server extra: pip install 'trainguard[server]'",
            err=True,
        )
        raise typer.Exit(2)


@db_app.callback()
def _db(ctx: typer.Context) -> None:
    need_server_extra(ctx.info_name or "db")


@token_app.callback()
def _token(ctx: typer.Context) -> None:
    need_server_extra(ctx.info_name or "token")


def _settings(database_url: str | None, data_dir: Path | None) -> Settings:
    """Settings from TRAINGUARD_* with the options given (None: not given) over them."""
    from pydantic import ValidationError

    from trainguard.backend.settings import Settings

    options = {"database_url": database_url, "data_dir": data_dir}
    given: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        fail(
            f"bad setting{' ' + where if where else ''}: {err['msg'].removeprefix('Value error, ')}"
        )


def server(
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
    database_url: DbUrlOpt = None,
    data_dir: DataDirOpt = None,
    log_level: Annotated[str, typer.Option()] = "info",
    log_format: Annotated[
        str, typer.Option(envvar="TRAINGUARD_LOG_FORMAT", help="text | json (one object a line)")
    ] = "text",
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            max=64,
            envvar="TRAINGUARD_SERVER_WORKERS",
            help="server processes on this port (SO_REUSEPORT; PostgreSQL only)",
        ),
    ] = 1,
) -> None:
    """Run the backend (API, ingest, live stream, dashboard at /)."""
    need_server_extra("server")
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE

    from trainguard.backend.app import Server, create_app, tune_gc
    from trainguard.backend.logs import uvicorn_log_config
    from trainguard.backend.workers import listen_backlog

    if log_format not in ("text", "json"):
        fail(f"--log-format must be text or json, not {log_format!r}")

    settings = _settings(database_url=database_url, data_dir=data_dir)
    if not settings.admin_token and not settings.demo and not _has_tokens(settings.url):
        fail(
            "no token configured: set TRAINGUARD_ADMIN_TOKEN (>= 16 chars), create one with "
            "`trainguard token create`, or run `trainguard demo`"
        )
    served: dict[str, Any] = {
        "log_level": log_level,
        "log_config": uvicorn_log_config(log_format, log_level),  # type: ignore[arg-type]  # checked text or json above
        # Long-polls and live streams end when the shutdown starts (app.Server); any other
        # request still open gets 3 s to finish.
        "timeout_graceful_shutdown": 3,
        # Agents keep one connection and send every agent_batch_interval_s: an idle
        # timeout shorter than that closes it between batches (a failed send, a new TCP
        # and TLS handshake each time).
        "timeout_keep_alive": int(max(5.0, 2 * settings.agent_batch_interval_s + 5)),
        # Every agent reconnects within one batch interval after a restart.
        "backlog": listen_backlog(),
    }
    if workers > 1:
        from trainguard.backend.workers import Supervisor

        if settings.is_sqlite:
            fail("--workers above 1 needs PostgreSQL (SQLite is the one-process path)")
        options = {"database_url": database_url, "data_dir": data_dir}
        try:
            supervisor = Supervisor(
                workers,
                host,
                port,
                {k: v for k, v in options.items() if v is not None},
                served,
            )
        except OSError as exc:
            fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
        raise typer.Exit(supervisor.run())
    api = create_app(settings)
    if settings.gc_tuning:
        tune_gc()
    # uvicorn.run's one-process path, with the server that ends long-polls at shutdown.
    running = Server(uvicorn.Config(api, host=host, port=port, **served))
    running.run()
    if not running.started:
        raise typer.Exit(STARTUP_FAILURE)


def demo(
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    data_dir: Annotated[Path, typer.Option(help="demo state (wiped at start)")] = Path("data/demo"),
    nodes: Annotated[
        int, typer.Option(min=1, max=64, help="simulated nodes (from 3 on, one is a hot spare)")
    ] = 3,
    gpus: Annotated[int, typer.Option(min=1, max=16, help="simulated GPUs per node")] = 2,
    job: Annotated[bool, typer.Option(help="run the demo training job with seeded faults")] = True,
    launcher: Annotated[
        DemoLauncher | None,
        typer.Option(help="the job's launcher (default: ft_launcher with NVRx, else torchrun)"),
    ] = None,
) -> None:
    """Backend (SQLite) + simulated agents + a small training job; dashboard on localhost."""
    need_server_extra("demo")
    from trainguard.backend.demo import run_demo

    raise typer.Exit(
        run_demo(
            host=host,
            port=port,
            data_dir=data_dir,
            nodes=nodes,
            gpus=gpus,
            with_job=job,
            launcher=launcher.value if launcher else None,
        )
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


def _token_session(database_url: str | None, data_dir: Path | None) -> Session:
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


def _run_migration(fn: Callable[[], object], url: str) -> None:
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
