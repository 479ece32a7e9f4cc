"""The backend SIGKILLed during steady ingest from several real agents, twice, and
restarted: once the agents' spools drain, every batch of every agent is stored exactly
once (seq 1..n without a gap or a double per agent process), every sampling tick whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.harness import Agent, Backend, Ledger, Procs, agent_tokens, batches_stored
from tests.support import free_port, wait_for
from trainguard.backend import db

pytestmark = pytest.mark.slow

NODES = ["crash-a", "crash-b", "crash-c"]
KILLS = 2


def test_sigkill_of_the_backend_loses_and_doubles_nothing(procs: Procs, tmp_path: Path) -> None:
    data = tmp_path / "data"
    url = f"sqlite:///{data / 'trainguard.db'}"
    data.mkdir()
    db.upgrade(url)
    tokens = agent_tokens(url, NODES)
    port = free_port()
    backend = Backend(procs, port, {"TRAINGUARD_DATA_DIR": str(data)}).start()
    agents = [Agent(procs, n, tokens[n], port, gpus=4, interval=0.1).start() for n in NODES]

    def stored_at_least(floor: dict[str, int]) -> bool:
        now = batches_stored(url)
        return all(now.get(n, 0) > floor.get(n, 0) + 10 for n in NODES)

    wait_for(lambda: stored_at_least({}), 60)
    for _ in range(KILLS):
        before = batches_stored(url)
        assert backend.proc is not None
        Procs.kill(backend.proc)  # mid-stream: 30 batches/s in flight, group commits
        wait_for(lambda: all(a.spooled_ticks() >= 3 for a in agents), 30)
        backend.start()  # same port, same database
        wait_for(lambda b=before: stored_at_least(b) and all(a.spooled() == 0 for a in agents), 90)

    for a in agents:
        assert a.stop() == 0, procs.log(a.log_name)[-3000:]
        assert a.spooled() == 0, f"{a.node} left batches in its spool"
        assert "dropped" not in procs.log(a.log_name)
    ledger = Ledger.read(url)
    ledger.assert_exactly_once(agents, max_tick_gap_s=2.0)
    assert ledger.gaps == []
    assert sum(len(s) for s in ledger.seqs.values()) > 3 * 30
    assert 500 not in backend.statuses()
