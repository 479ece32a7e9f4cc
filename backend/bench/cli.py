"""`trainguard bench`: the benchmarks (results go to docs/benchmarks.md).

They run from a checkout (`pip install -e .`), not from the wheel: backend/bench is left
out of its packages, and the root CLI says so in one line when this module is missing.
Each command imports its benchmark when it runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from trainguard.backend.bench.chaos_config import DEFAULT_BENCH_KINDS, DEFAULT_KINDS
from trainguard.backend.cli import DbUrlOpt, fail

app = typer.Typer(help="Benchmarks (results go to docs/benchmarks.md).", no_args_is_help=True)

# What the generated nodes send. Agents switch to MessagePack when the backend offers it
# (every ingest answer's Accept-Post), so msgpack is what a fleet sends.
EncodingOpt = Annotated[str, typer.Option(help="json | msgpack: the batches' Content-Type")]


def _check_encoding(encoding: str) -> None:
    if encoding not in ("json", "msgpack"):
        fail(f"--encoding must be json or msgpack, not {encoding!r}")


@app.command("ingest")
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
    server_workers: Annotated[
        int, typer.Option(min=1, max=64, help="backend processes (`server --workers`; PostgreSQL)")
    ] = 1,
    encoding: EncodingOpt = "json",
    ramp: Annotated[
        float,
        typer.Option(
            min=0,
            help="seconds over which the nodes start (default and least: one batch "
            "interval); each then sends for --duration",
        ),
    ] = 0,
    ranks: Annotated[
        int,
        typer.Option(
            min=0,
            max=1024,
            help="training ranks per node, listed in each of its batches as an agent does "
            "(0: no rank table)",
        ),
    ] = 0,
    database_url: DbUrlOpt = None,
    data_dir: Annotated[Path, typer.Option()] = Path("data/bench"),
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8311,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result here")] = None,
) -> None:
    """Sustained end-to-end ingest: load generators -> HTTP -> one backend -> database."""
    from trainguard.backend.bench.ingest import run

    _check_encoding(encoding)
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
            server_workers=server_workers,
            encoding=encoding,
            ramp=ramp,
            ranks=ranks,
        )
    )


@app.command("stragglers")
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


@app.command("decode")
def bench_decode(
    loops: Annotated[int, typer.Option(min=1, help="decodes per repeat")] = 2000,
    repeats: Annotated[int, typer.Option(min=1, help="the median of these is reported")] = 7,
) -> None:
    """In process: decoding an ingest body of 64 samples and one of 64 events (each
    kind's data as its producer makes it), JSON and MessagePack, per batch and event."""
    from trainguard.backend.bench.decode import run

    _print_report(run(loops=loops, repeats=repeats))


@app.command("decision")
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


@app.command("recovery")
def bench_recovery(
    modes: Annotated[
        str,
        typer.Option(
            help="comma-separated: baseline,launcher,in_process (one fault kind each); "
            "mixed_baseline,mixed_launcher,mixed_nvrx,engine,engine_after_nvrx (mixed kinds); "
            "launcher_warm (warm pool); exclude_spare,exclude_shrink (XID 79 on a node: a "
            "hot spare takes its place, or the job shrinks)"
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


@app.command("gpu")
def bench_gpu(
    cpu: Annotated[
        bool, typer.Option("--cpu", help="gloo and `--simulate 2` instead of NCCL and NVML")
    ] = False,
    jobs: Annotated[
        str,
        typer.Option(help="comma-separated: torchrun-cold,torchrun-warm,ft_launcher-cold,..."),
    ] = "torchrun-cold,torchrun-warm,ft_launcher-cold,ft_launcher-warm",
    faults: Annotated[str, typer.Option(help="comma-separated: exception,sigkill")] = (
        "exception,sigkill"
    ),
    timeout: Annotated[float, typer.Option(min=30, help="seconds for the whole check")] = 330.0,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result here")] = None,
) -> None:
    """The device check (deploy/gpu-check.sh): the NVML agent's readings and recovery per
    fault under torchrun and ft_launcher + Wrapper, cold and warm, on CUDA/NCCL."""
    from trainguard.backend.bench import gpucheck

    args = ["--jobs", jobs, "--faults", faults, "--timeout", str(timeout)]
    args += ["--cpu"] if cpu else []
    args += ["--json", str(json_out)] if json_out else []
    code = gpucheck.main(args)
    if code:
        raise typer.Exit(code)


@app.command("chaos")
def bench_chaos(
    minutes: Annotated[str, typer.Option(metavar="M", help="minutes of faults")] = "10",
    seed: Annotated[
        str, typer.Option(metavar="S", help="seeds the faults and agent deaths")
    ] = "42",
    out: Annotated[Path | None, typer.Option(help="write the JSON report here")] = None,
    bench_every: Annotated[
        str,
        typer.Option(
            "--bench-every",
            "--agent-every",
            metavar="SECONDS",
            help="mean time between two of the bench's faults from outside the job (0: none)",
        ),
    ] = "90",
    steps: Annotated[str, typer.Option(metavar="N", help="steps per job run")] = "800",
    faults_per_run: Annotated[str, typer.Option(metavar="N", help="faults per job run")] = "5",
    kinds: Annotated[
        str, typer.Option(metavar="KIND:W,...", help="the job's own faults and their weights")
    ] = DEFAULT_KINDS,
    bench_kinds: Annotated[
        str,
        typer.Option(
            metavar="KIND:W,...",
            help="the bench's faults from outside the job: agent_death, agent_stop, "
            "user_sigterm, manual_restart, with weights ('none': no such fault)",
        ),
    ] = DEFAULT_BENCH_KINDS,
    policy: Annotated[
        Path | None, typer.Option(help="a policy TOML for the server (default: its defaults)")
    ] = None,
    workdir: Annotated[Path | None, typer.Option(help="keep the run's files here")] = None,
) -> None:
    """The demo job under mixed seeded faults (exception, SIGKILL, hang, XID 79; agents
    killed or stopped, the user's SIGTERM, an operator's restarts against a small budget)
    against a real server for M minutes: incidents, wrongful actions, false states,
    recovery."""
    from trainguard.backend.bench.chaos import ChaosError, parse_config, run
    from trainguard.backend.bench.chaos_report import table

    try:
        cfg = parse_config(minutes, seed, bench_every, steps, faults_per_run, kinds, bench_kinds)
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


@app.command("replay")
def bench_replay(
    incidents: Annotated[int, typer.Option(min=1, help="faults in the synthetic period")] = 10_000,
    jobs: Annotated[int, typer.Option(min=1, help="jobs of 2 nodes x 2 ranks")] = 16,
    gap: Annotated[float, typer.Option(min=20, help="seconds between a job's faults")] = 120,
    seed: Annotated[int, typer.Option()] = 42,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result here")] = None,
) -> None:
    """The policy replay over a synthetic period of N incidents: wall, incidents/s,
    engine cycles, peak RSS (issue #36: 10,000 incidents in under a minute)."""
    from trainguard.backend.bench.replay import run

    result = run(incidents, jobs, gap, seed)
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=2))
    _print_report(result)


@app.command("checkpoint")
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


@app.command("soak")
def bench_soak(
    minutes: Annotated[float, typer.Option(min=0.1)] = 10,
    nodes: Annotated[int, typer.Option(min=0, help="simulated nodes of the load generator")] = 256,
    agents: Annotated[int, typer.Option(min=0, max=64, help="real agent processes")] = 4,
    gpus: Annotated[int, typer.Option(min=1, max=64)] = 8,
    period: Annotated[float, typer.Option(min=0.01)] = 1,
    workers: Annotated[int, typer.Option(min=1, max=64)] = 1,
    every: Annotated[float, typer.Option(min=0.5, help="seconds between RSS readings")] = 10,
    batch_interval: Annotated[
        float | None,
        typer.Option(min=0.01, help="seconds between a node's batches (default: --period)"),
    ] = None,
    server_workers: Annotated[
        int, typer.Option(min=1, max=64, help="backend processes (`server --workers`; PostgreSQL)")
    ] = 1,
    encoding: EncodingOpt = "json",
    database_url: DbUrlOpt = None,
    data_dir: Annotated[Path, typer.Option()] = Path("data/soak"),
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8316,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result here")] = None,
) -> None:
    """Memory over a sustained ingest run: backend and agent RSS at start, middle, end."""
    from trainguard.backend.bench.soak import run

    _check_encoding(encoding)
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
            batch_interval=batch_interval,
            server_workers=server_workers,
            encoding=encoding,
        )
    )


@app.command("agent")
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


@app.command("retention")
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


@app.command("sample-index")
def bench_sample_index(
    gpus: Annotated[int, typer.Option(min=8, help="simulated GPUs, 8 a node")] = 131_072,
    seconds: Annotated[int, typer.Option(min=1, help="simulated seconds per layout")] = 300,
    window: Annotated[int, typer.Option(min=1, help="simulated seconds per reported row")] = 30,
    batch_interval: Annotated[int, typer.Option(min=1, max=64, help="seconds a batch")] = 8,
    layout: Annotated[
        list[str] | None,
        typer.Option(help="gpu_ts | bucket_gpu_ts | bucket_gpu, repeatable (default: all)"),
    ] = None,
    database_url: DbUrlOpt = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result here")] = None,
) -> None:
    """PostgreSQL's cost per stored sample as samples accumulate, with the samples' index
    before migration 0011, (gpu_id, ts), after it, (bucket, gpu_id, ts), and without ts,
    (bucket, gpu_id)."""
    from trainguard.backend.bench.sample_index import LAYOUTS, run, table

    url = _postgres_url("sample-index", database_url)
    unknown = [x for x in layout or () if x not in LAYOUTS]
    if unknown:
        fail(f"unknown --layout {unknown[0]!r}: one of {', '.join(LAYOUTS)}")
    result = run(url, gpus, seconds, window, batch_interval, layout)
    _write_result(result, table(result), json_out)


@app.command("sample-layout")
def bench_sample_layout(
    gpus: Annotated[int, typer.Option(min=1, help="GPUs whose batch each round stores")] = 16_384,
    batch_interval: Annotated[
        int, typer.Option(min=1, max=64, help="samples per GPU per batch (1 Hz)")
    ] = 8,
    rounds: Annotated[int, typer.Option(min=1, help="rounds, the layouts' order alternating")] = 4,
    database_url: DbUrlOpt = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result here")] = None,
) -> None:
    """PostgreSQL's and the client's cost per sample: a row per sample (`samples` now)
    against a row per GPU per batch, as arrays or as packed records."""
    from trainguard.backend.bench.sample_layout import run, table

    result = run(_postgres_url("sample-layout", database_url), gpus, batch_interval, rounds)
    _write_result(result, table(result), json_out)


def _postgres_url(command: str, database_url: str | None) -> str:
    """The URL of a bench that measures PostgreSQL itself; one line and exit 2 otherwise."""
    if not (database_url or "").startswith("postgresql"):
        fail(f"bench {command} needs a PostgreSQL --database-url")
    return database_url or ""


def _write_result(result: dict[str, Any], table: str, json_out: Path | None) -> None:
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=2))
    typer.echo(table)


def _print_report(report: dict) -> None:
    width = max(len(k) for k in report)
    for k, v in report.items():
        typer.echo(f"{k:<{width}}  {v}")
