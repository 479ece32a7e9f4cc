"""The one CLI, `trainguard`: the root command and the agent's command.

Every other part registers its commands in the `trainguard.commands` entry-point group
(pyproject.toml): a `typer.Typer` there becomes a command group, a function one command.
This module names no module of theirs, and a part's module imports nothing heavy at the
top, so a GPU node with only the `agent` extra never imports the server's dependencies.
A part that is not in this install (the benchmarks, which run from a checkout) still
answers: one line, exit 2.

User mistakes print one line and exit non-zero, never a traceback.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

COMMANDS_GROUP = "trainguard.commands"

app = typer.Typer(
    name="trainguard",
    help="Keeps large distributed PyTorch training jobs running.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"trainguard: {message}", err=True)
    raise typer.Exit(code)


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
    pool: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=256,
            help="keep N warm worker interpreters (torch, DCP, NVRx imported) for workers "
            "started by `trainguard-worker` (0: off)",
        ),
    ] = None,
    preload: Annotated[
        str | None, typer.Option(help="more modules the warm pool imports, comma-separated")
    ] = None,
    pool_python: Annotated[
        str | None, typer.Option(help="the workers' Python for the pool (default: this one)")
    ] = None,
) -> None:
    """Run the node agent: GPU health, XIDs, rank heartbeats and steps -> backend."""
    from pydantic import ValidationError

    from trainguard.agent.config import AgentConfig
    from trainguard.agent.daemon import main as agent_main

    # Only the options given: the others come from TRAINGUARD_AGENT_* or the config file.
    options = {
        "server": server,
        "token": token,
        "node": node,
        "simulate": simulate,
        "interval": interval,
        "metrics_port": metrics_port,
        "socket_path": socket,
        "pool": pool,
        "preload": preload,
        "pool_python": pool_python,
    }
    given: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
    try:
        cfg = AgentConfig(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        fail(f"bad agent setting {'.'.join(str(p) for p in err['loc'])}: {err['msg']}")
    if not cfg.token:
        fail("no agent token: --token, TRAINGUARD_AGENT_TOKEN or `token` in the config file")
    raise typer.Exit(agent_main(cfg, setup=_add_local_components))


def _add_local_components(agent_obj: Any) -> None:
    """The SDK socket server (ranks, steps, heartbeats) and the command executor."""
    from trainguard.agent.executors.loop import CommandLoop
    from trainguard.agent.ranks.server import LocalServer

    try:
        local = LocalServer(agent_obj)
    except OSError as exc:  # no well-known place for the SDK socket is usable
        fail(f"agent: {exc}")
    agent_obj.add_component(local)
    loop = CommandLoop(agent_obj, local)
    local.restart_wait_s = loop.restarted_timeout_s
    agent_obj.add_component(loop)
    if agent_obj.config.store_port:
        from trainguard.agent.executors.storehost import StoreHost

        agent_obj.add_component(StoreHost(agent_obj.config.store_port, agent_obj.config.store_host))
    if agent_obj.config.pool:
        from trainguard.worker import pool_path_for
        from trainguard.worker.supervisor import PoolProcess

        cfg = agent_obj.config
        agent_obj.add_component(
            PoolProcess(pool_path_for(local.socket_path), cfg.pool, cfg.preload, cfg.pool_python)
        )
    if agent_obj.config.metrics_port is not None:
        from trainguard.agent.metrics import AgentExporter

        cfg = agent_obj.config
        agent_obj.add_component(AgentExporter(agent_obj, cfg.metrics_port, cfg.metrics_host))


def add_part_commands(root: typer.Typer, entry_points: metadata.EntryPoints) -> None:
    """Adds each entry point's command (a function) or command group (a typer.Typer) to
    `root` under the entry point's name; the first of two with one name wins. A part that
    cannot load still gets its name, answering one line and exit 2, so that a broken or
    absent part never takes `trainguard agent` down with it."""
    taken = {c.name for c in root.registered_commands} | {g.name for g in root.registered_groups}
    for ep in entry_points:
        if ep.name in taken:
            continue
        taken.add(ep.name)
        try:
            target = ep.load()
        except ModuleNotFoundError as exc:
            if exc.name and (ep.module + ".").startswith(exc.name + "."):
                # The part's own module is not installed: it runs from a checkout only.
                _add_unavailable(
                    root,
                    ep.name,
                    f"runs from a checkout of the repository, not from an installed wheel "
                    f"(no {exc.name} here): `pip install -e .` in the checkout",
                )
            else:
                _add_unavailable(root, ep.name, f"cannot load: {exc}")
            continue
        except Exception as exc:  # a part's bug must not break the other commands
            _add_unavailable(root, ep.name, f"cannot load: {type(exc).__name__}: {exc}")
            continue
        if isinstance(target, typer.Typer):
            root.add_typer(target, name=ep.name)
        else:
            root.command(ep.name)(target)


def _add_unavailable(root: typer.Typer, name: str, why: str) -> None:
    def unavailable() -> None:
        typer.echo(f"trainguard {name} {why}", err=True)
        raise typer.Exit(2)

    root.command(
        name,
        help="(not available in this install)",
        # Whatever follows (a subcommand, options, --help) gets the same one line.
        context_settings={
            "allow_extra_args": True,
            "ignore_unknown_options": True,
            "help_option_names": [],
        },
    )(unavailable)


add_part_commands(app, metadata.entry_points(group=COMMANDS_GROUP))


def main() -> None:  # pragma: no cover - console entry
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
