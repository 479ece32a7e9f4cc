"""`trainguard policy replay|export` (docs/cli.md, docs/replay.md).

Like backend/cli.py, this module imports typer and nothing of the server; each command
imports the replay when it runs. User mistakes print one line and exit 2."""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    from trainguard.backend.replay.trace import Trace
    from trainguard.backend.settings import Settings

# The options of backend/cli.py (which sits above this package: its helpers are not
# imported from here).
DbUrlOpt = Annotated[
    str | None, typer.Option(envvar="TRAINGUARD_DATABASE_URL", help="SQLAlchemy URL")
]
DataDirOpt = Annotated[
    Path | None, typer.Option(envvar="TRAINGUARD_DATA_DIR", help="SQLite and state folder")
]

app = typer.Typer(
    help="Decision policies: replay a period under a candidate.", no_args_is_help=True
)

SinceOpt = Annotated[str | None, typer.Option("--since", help="the last period: 90s, 30m, 12h, 7d")]
FromOpt = Annotated[str | None, typer.Option("--from", help="period start: ISO time or Unix s")]
ToOpt = Annotated[str | None, typer.Option("--to", help="period end: ISO time or Unix s")]
JobOpt = Annotated[str | None, typer.Option(help="one job only")]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"trainguard: {message}", err=True)
    raise typer.Exit(code)


@app.callback()
def _policy() -> None:
    import importlib.util

    if any(importlib.util.find_spec(m) is None for m in ("sqlalchemy", "alembic", "fastapi")):
        fail("trainguard policy needs the server extra: pip install 'trainguard[server]'")


def _settings(database_url: str | None, data_dir: Path | None) -> Settings:
    from pydantic import ValidationError

    from trainguard.backend.settings import Settings

    options: dict[str, Any] = {"database_url": database_url, "data_dir": data_dir}
    try:
        return Settings(**{k: v for k, v in options.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        fail(f"bad setting {where}: {err['msg'].removeprefix('Value error, ')}")


def _instant(value: str, option: str) -> float:
    try:
        return float(value)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        fail(f"{option} {value!r} is neither an ISO time nor Unix seconds")
    return dt.timestamp()


def period(since: str | None, start: str | None, end: str | None) -> tuple[float, float]:
    """(from, to) from --since, or --from and --to (--to defaults to now)."""
    if since is not None and start is not None:
        fail("give --since or --from, not both")
    until = _instant(end, "--to") if end is not None else time.time()
    if since is not None:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", since)
        if m is None or float(m.group(1)) <= 0:
            fail(f"--since {since!r} is not a duration like 90s, 30m, 12h or 7d")
        return until - float(m.group(1)) * _UNITS[m.group(2) or "s"], until
    if start is None:
        fail("give the period: --since 7d, or --from T [--to T]")
    begin = _instant(start, "--from")
    if begin >= until:
        fail(f"--from {start} is not before --to")
    return begin, until


def _export(settings: Settings, since: float, until: float, job: str | None, redact: bool) -> Trace:
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm import Session

    from trainguard.backend import db
    from trainguard.backend.replay import service

    engine = db.make_engine(settings.url)
    try:
        with Session(engine) as s:
            return service.export(s, since, until, job, redact)
    except service.ReplayRefused as exc:
        fail(exc.message)
    except OperationalError as exc:
        fail(f"cannot read the database: {str(exc.orig).strip().splitlines()[0]}")
    finally:
        engine.dispose()


@app.command("export")
def export(
    out: Annotated[Path, typer.Option("--out", help="the trace file to write (JSON lines)")],
    since: SinceOpt = None,
    start: FromOpt = None,
    end: ToOpt = None,
    job: JobOpt = None,
    redact: Annotated[bool, typer.Option(help="hostnames -> node-N, tokens removed")] = False,
    database_url: DbUrlOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Export a period's recorded evidence and decisions to a trace file."""
    from trainguard.backend.replay import trace

    begin, until = period(since, start, end)
    settings = _settings(database_url, data_dir)
    tr = _export(settings, begin, until, job, redact)
    try:
        digest = trace.save(tr, out)
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}")
    counts = ", ".join(f"{len(tr[k])} {k}s" for k in ("event", "step", "incident"))
    typer.echo(f"{out}: {trace.FORMAT} v{trace.VERSION}, {counts}, sha256 {digest[:12]}")


@app.command("replay")
def replay(
    policy: Annotated[Path, typer.Option("--policy", help="the candidate policy (TOML)")],
    since: SinceOpt = None,
    start: FromOpt = None,
    end: ToOpt = None,
    job: JobOpt = None,
    trace_file: Annotated[
        Path | None, typer.Option("--trace", help="replay this trace file, not the database")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="also write the whole report here ('-': stdout)")
    ] = None,
    database_url: DbUrlOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Replay a period's evidence through the engine under a candidate policy, beside the
    policy in force, on scratch databases (nothing live is written, nothing is sent)."""
    from trainguard.backend.engine.policy import PolicyError, load_policy
    from trainguard.backend.replay import service, trace
    from trainguard.backend.replay.trace import TraceError

    settings = _settings(database_url, data_dir)
    try:
        candidate = load_policy(policy)
    except PolicyError as exc:
        fail(f"bad candidate policy: {exc}")
    if trace_file is not None:
        if since or start or end or job:
            fail("--trace replays the whole file: leave out --since/--from/--to/--job")
        try:
            tr = trace.load(trace_file)
        except TraceError as exc:
            fail(str(exc))
    else:
        begin, until = period(since, start, end)
        tr = _export(settings, begin, until, job, False)
    try:
        out = service.replay_under(settings, tr, candidate)
    except service.ReplayRefused as exc:
        fail(exc.message)
    except service.ReplayTooLarge as exc:
        fail(exc.message)
    if json_out is not None:
        text = json.dumps(out, indent=1, sort_keys=True)
        if str(json_out) == "-":
            sys.stdout.write(text + "\n")
            return
        json_out.write_text(text + "\n")
    typer.echo(render(out))


def render(out: dict[str, Any]) -> str:
    """The report in a few lines: totals per run, then each incident the runs differ on."""
    lines = [
        f"replayed {out['evidence']} events, {out['self_check']['incidents']} incidents "
        f"in {out['replay_s']:.1f} s; policies: in force {out['policies']['current']}, "
        f"candidate {out['policies']['candidate']}"
    ]
    sc = out["self_check"]
    lines.append(
        "self-check (record vs policy in force): "
        + ("exact" if sc["exact"] else f"{sc['mismatches']} incidents differ")
    )
    head = f"{'':10} {'incidents':>9} {'cordons':>7} {'holds':>5} {'escal.':>6} {'recovery s':>10}"
    lines += [head + "  actions"]
    for name, t in out["totals"].items():
        acts = ", ".join(f"{k} {v}" for k, v in t["actions"].items()) or "-"
        lines.append(
            f"{name:10} {t['incidents']:>9} {t['cordons']:>7} {t['breaker_holds']:>5} "
            f"{t['escalations']:>6} {t['expected_recovery_s']:>10.1f}  {acts}"
        )
    for row in out["incidents"]:
        if row.get("differs") or not row["self_check"]:
            cur, cand = row.get("current"), row.get("candidate")
            lines.append(
                f"  {row['job']} {row['cause']} on {row['node'] or '-'} at {row['fault_at']:.3f}: "
                f"in force {_acts(cur)}, candidate {_acts(cand)}"
            )
    model = ", ".join(
        f"{k} {v['median_s']:g} s (n={v['n']})" for k, v in out["recovery_model"].items()
    )
    lines.append(f"recovery measured here: {model or 'no resolved incident in the period'}")
    return "\n".join(lines)


def _acts(s: dict[str, Any] | None) -> str:
    if s is None:
        return "no incident"
    acts = "+".join(s["actions"]) or "no action"
    extra = f", cordons {','.join(s['cordons'])}" if s["cordons"] else ""
    holds = f", {s['breaker_holds']} breaker holds" if s["breaker_holds"] else ""
    return f"{acts} ({s['status']}{extra}{holds})"
