"""Benchmark (not a test) of the dashboard's overview at the floor scale of DESIGN.md:
2,048 nodes with 8 GPUs each (16,384 GPUs) in the database of a real `trainguard server`.

Measures
- the overview API's latency (GET /nodes, /jobs, /incidents?status=open, /events?limit=50,
  the calls the overview makes on load): p50 / p95 / max over sequential requests;
- time to first render in headless chromium: from navigation start to the first frame
  with all 2,048 tiles (the page's `trainguard:overview-nodes` performance mark), over
  fresh loads of the page, and when the node list reached the page
  (`trainguard:overview-nodes-data`), which splits it into network + server and drawing;
- the cost of one live update (a `nodes` tick of the SSE stream re-rendering the grid, the
  counts and the table), as the page reports it.

Run:  .venv/bin/python tests/frontend/bench_overview.py [--nodes 2048] [--gpus 8] [--loads 5]
The cluster is seeded through POST /api/v1/ingest (one batch per node: GPU inventory and
one sample per GPU), as agents would; 1 % of the nodes then report an XID, 0.5 % are
cordoned, so the grid shows every colour. Results are printed as JSON; a screenshot goes to
artifacts/screenshots/overview-2048.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from playwright.sync_api import sync_playwright  # noqa: E402 - after the sys.path line above

from tests.frontend.conftest import CHROMIUM, SCREENSHOTS, Cluster  # noqa: E402 - after the sys.path line above
from tests.frontend.seed import JobSeed, cluster_batches, xid_batch  # noqa: E402 - after the sys.path line above
from tests.support import free_port  # noqa: E402 - after the sys.path line above


def start(data_dir: Path, engine: bool) -> Cluster:
    cluster = Cluster(f"http://127.0.0.1:{free_port()}", secrets.token_urlsafe(24), data_dir)
    port = cluster.url.rsplit(":", 1)[1]
    server = cluster.start(
        "server",
        ["server", "--host", "127.0.0.1", "--port", port, "--log-level", "warning"],
        {
            "TRAINGUARD_ADMIN_TOKEN": cluster.token,
            "TRAINGUARD_DATA_DIR": str(data_dir),
            # Seeded nodes report once: keep them "healthy" for the whole run.
            "TRAINGUARD_NODE_DOWN_AFTER_S": "86400",
            "TRAINGUARD_ENGINE_ENABLED": "true" if engine else "false",
        },
    )
    cluster.wait(lambda: cluster._ready(server), "the server never became ready")
    return cluster


def seed(cluster: Cluster, nodes: int, gpus: int) -> float:
    now = time.time()
    batches = cluster_batches(nodes, gpus, now)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda b: cluster.api("ingest", b), batches))
    for n in range(0, nodes, 100):
        gpu = batches[n]["gpus"][0]["uuid"]
        cluster.api("ingest", xid_batch(f"gpu-node-{n:04d}", 79, time.time(), gpu=gpu))
    for n in range(50, nodes, 200):
        cluster.api(f"nodes/gpu-node-{n:04d}/cordon", {"reason": "benchmark"})
    return time.perf_counter() - t0


BENCH_JOB = "bench-job"


def seed_job(cluster: Cluster, ranks: int, steps: int) -> float:
    """A job of `ranks` ranks (8 per node, on the first nodes) with `steps` steps each."""
    nodes = [f"gpu-node-{n:04d}" for n in range(max(1, ranks // 8))]
    job = JobSeed(BENCH_JOB, nodes, ranks_per_node=8, steps=steps, slow_rank=ranks // 3)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda b: cluster.api("ingest", b), job.batches(time.time())))
    return time.perf_counter() - t0


def job_page(cluster: Cluster, ranks: int, loads: int) -> dict[str, Any]:
    """Open the job page: time to the first frame with the heatmap drawn, and the time
    the page spent building and drawing the matrix (heatmap + line chart)."""
    marks, draws, cells = [], [], 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        for i in range(loads):
            context = browser.new_context(viewport={"width": 1440, "height": 900})
            page = context.new_page()
            page.add_init_script(
                f"sessionStorage.setItem('trainguard.token', {json.dumps(cluster.token)})"
            )
            page.goto(f"{cluster.url}/#/jobs/{BENCH_JOB}")
            page.wait_for_function(
                "() => performance.getEntriesByName('trainguard:job-steps').length > 0",
                timeout=120_000,
            )
            heatmap = page.locator("#step-heatmap")
            assert heatmap.get_attribute("data-ranks") == str(ranks)
            cells = int(heatmap.get_attribute("data-cells") or 0)
            marks.append(
                page.evaluate("performance.getEntriesByName('trainguard:job-steps')[0].startTime")
            )
            draws.append(float(heatmap.get_attribute("data-draw-ms") or 0))
            if i == loads - 1:
                page.screenshot(path=str(SCREENSHOTS / f"job-{ranks}-ranks.png"), full_page=True)
            context.close()
        browser.close()
    return {
        "ranks": ranks,
        "cells_drawn": cells,
        "first_heatmap_ms": [round(m) for m in marks],
        "first_heatmap_median_ms": round(statistics.median(marks)),
        "build_and_draw_ms": draws,
        "build_and_draw_median_ms": round(statistics.median(draws), 1),
    }


def latency(cluster: Cluster, path: str, n: int) -> dict[str, float]:
    request = urllib.request.Request(
        f"{cluster.url}/api/v1/{path}", headers={"Authorization": f"Bearer {cluster.token}"}
    )
    times = []
    size = 0
    for i in range(n + 5):
        t0 = time.perf_counter()
        with urllib.request.urlopen(request, timeout=30) as response:
            size = len(response.read())
        if i >= 5:  # warm-up
            times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(times[int(0.95 * (len(times) - 1))], 1),
        "max_ms": round(times[-1], 1),
        "bytes": size,
        "requests": n,
    }


def first_render(cluster: Cluster, nodes: int, loads: int) -> dict[str, Any]:
    marks, data_at, updates = [], [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        for i in range(loads):
            context = browser.new_context(viewport={"width": 1440, "height": 900})
            page = context.new_page()
            page.add_init_script(
                f"sessionStorage.setItem('trainguard.token', {json.dumps(cluster.token)})"
            )
            page.goto(cluster.url + "/#/")
            page.wait_for_function(
                "() => performance.getEntriesByName('trainguard:overview-nodes').length > 0",
                timeout=60_000,
            )
            count = page.eval_on_selector(".node-grid", "el => Number(el.dataset.count)")
            assert count == nodes, f"the grid drew {count} tiles, not {nodes}"
            marks.append(
                page.evaluate(
                    "performance.getEntriesByName('trainguard:overview-nodes')[0].startTime"
                )
            )
            data_at.append(
                page.evaluate(
                    "performance.getEntriesByName('trainguard:overview-nodes-data')[0].startTime"
                )
            )
            # Live updates: wait for two `nodes` ticks and read what the last one cost.
            page.wait_for_function(
                "() => document.querySelector('.updated')?.dataset.source === 'live'",
                timeout=30_000,
            )
            page.wait_for_timeout(2500)
            updates.append(float(page.locator(".updated").get_attribute("data-render-ms") or 0))
            if i == loads - 1:
                SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SCREENSHOTS / f"overview-{nodes}.png"), full_page=True)
            context.close()
        browser.close()
    return {
        "first_render_ms": [round(m) for m in marks],
        "first_render_median_ms": round(statistics.median(marks)),
        "nodes_answer_in_page_ms": [round(m) for m in data_at],
        "live_update_ms": updates,
        "live_update_median_ms": round(statistics.median(updates), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2048)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--loads", type=int, default=5, help="fresh page loads to time")
    parser.add_argument("--requests", type=int, default=200, help="requests per API route")
    parser.add_argument(
        "--no-engine", action="store_true", help="run the server without the decision engine"
    )
    parser.add_argument(
        "--job-ranks", type=int, default=1024, help="ranks of the job page's job (0: none)"
    )
    parser.add_argument("--job-steps", type=int, default=90, help="steps of each rank")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tg-bench-ui-") as tmp:
        cluster = start(Path(tmp), engine=not args.no_engine)
        try:
            seeded_s = seed(cluster, args.nodes, args.gpus)
            api = {
                path: latency(cluster, path, args.requests)
                for path in ["nodes", "jobs", "incidents?status=open&limit=50", "events?limit=50"]
            }
            ui = first_render(cluster, args.nodes, args.loads)
            job = None
            if args.job_ranks:
                job_seed_s = seed_job(cluster, args.job_ranks, args.job_steps)
                n = max(5, args.requests // 20)
                job_api = {
                    path: latency(cluster, f"jobs/{BENCH_JOB}/{path}", n)
                    for path in ["steps?limit=100000", "stragglers", "goodput?window=24h", "advice"]
                }
                job = {
                    "seed_s": round(job_seed_s, 1),
                    "api": job_api,
                    **job_page(cluster, args.job_ranks, args.loads),
                }
        finally:
            cluster.stop()
    print(
        json.dumps(
            {
                "nodes": args.nodes,
                "gpus": args.nodes * args.gpus,
                "database": "SQLite (the server's default)",
                "engine": not args.no_engine,
                "seed_s": round(seeded_s, 1),
                "api": api,
                "ui": ui,
                "job_page": job,
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
                f"Python {platform.python_version()}",
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
