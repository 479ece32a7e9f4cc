"""The backend unreachable for longer than the agent's spool holds (a 1 MiB spool, the
smallest the agent accepts, filled in seconds by 16 simulated GPUs at 50 Hz): the agent
drops the oldest batches, counts what they held, and reports it as one `spool_gap` event
when it reconnects. The count is exact (the missing seqs are the dropped batches), no
sample inside the reported window is stored, and the samples API breaks the chart's line
there (a null row), which is how the dashboard shows the gap."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from tests.reliability.harness import Agent, Backend, Ledger, Procs, agent_tokens
from tests.support import free_port, wait_for
from trainguard.backend import db

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
NODE = "spool-full"
GPUS = 16
INTERVAL = 0.02


def committed_bytes(spool: Path) -> int:
    """The size of the batches the spool holds, as the agent sees them while it runs: a
    `.tmp-` file is a write in flight (pathlib's glob matches dot files), and a batch may
    be dropped between the listing and its stat."""
    total = 0
    for p in spool.glob("*.batch"):
        if not p.name.startswith(".tmp-"):
            with contextlib.suppress(FileNotFoundError):
                total += p.stat().st_size
    return total


def test_an_overflowing_spool_drops_the_oldest_and_reports_the_gap(
    procs: Procs, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    url = f"sqlite:///{data / 'trainguard.db'}"
    db.upgrade(url)
    token = agent_tokens(url, [NODE])[NODE]
    port = free_port()
    backend = Backend(procs, port, {"TRAINGUARD_DATA_DIR": str(data)}).start()
    api = backend.api()
    agent = Agent(procs, NODE, token, port, gpus=GPUS, interval=INTERVAL, spool_max_bytes=MIB)
    agent.start()
    wait_for(lambda: len(api.get(f"/nodes/{NODE}/gpus").json()) == GPUS, 60)
    assert backend.proc is not None
    Procs.stop(backend.proc)  # away for longer than 1 MiB of spool lasts

    def dropped() -> int:
        try:
            return int(json.loads((agent.spool / "gap.json").read_text())["batches"])
        except (OSError, ValueError, KeyError):
            return 0

    wait_for(lambda: dropped() >= 5, 90, 0.2)  # the spool is full and has dropped some
    assert committed_bytes(agent.spool) <= MIB

    backend.start()
    gaps = wait_for(lambda: api.get("/events", params={"kind": "spool_gap"}).json(), 60)
    wait_for(lambda: agent.spooled() == 0, 60)
    assert agent.stop() == 0

    # One event, through the API the dashboard reads.
    assert len(gaps) == 1
    gap = gaps[0]
    d = gap["data"]
    assert gap["node"] == NODE and gap["kind"] == "spool_gap"
    assert gap["message"].startswith("agent dropped data: samples=")
    assert d["batches"] >= 5 and d["samples"] >= d["batches"] and d["from"] < d["to"]
    log = procs.log(agent.log_name)
    assert f"spool overflowed: {d['batches']} batches ({d['samples']} samples) were dropped" in log

    # Exact: the dropped batches are the missing seqs, one unbroken run.
    ledger = Ledger.read(url)
    [seqs] = [s for (node, _), s in ledger.seqs.items() if node == NODE]
    missing = sorted(set(range(1, max(seqs) + 1)) - set(seqs))
    assert len(missing) == d["batches"] == missing[-1] - missing[0] + 1
    assert ledger.events.get((NODE, "agent_start")) == 1
    # No sample inside the reported window was stored, some on each side; ticks are whole.
    stamps = [ts for ts, _ in ledger.ticks[NODE]]
    assert not [t for t in stamps if d["from"] <= t <= d["to"]]
    assert min(stamps) < d["from"] and max(stamps) > d["to"]
    assert all(n == GPUS for _, n in ledger.ticks[NODE])
    assert ledger.samples == ledger.batch_samples and ledger.duplicate_samples == 0

    # The chart's series over the window: a null row inside the gap breaks the line.
    uuid = api.get(f"/nodes/{NODE}/gpus").json()[0]["uuid"]
    since, until = d["from"] - 5, d["to"] + 5
    series = api.get(
        f"/gpus/{uuid}/samples",
        params={"since": since, "until": until, "points": int((until - since) / 0.5)},
    ).json()["columns"]
    assert None in series["util"]
    nulls = [t for t, u in zip(series["ts"], series["util"], strict=True) if u is None]
    assert any(d["from"] - 1 <= t <= d["to"] + 1 for t in nulls), (nulls, d)
