"""The agent's launcher watch (agent/ranks/launchers.py) against real processes: the
torch-free launcher (mini_launcher.py) run under the name `torchrun`, so /proc shows a
torchrun command line; its ranks register with the real SDK server. One with workers is
active, one started with none waits as a spare, one of another agent's socket is not
this node's."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from tests.support import wait_for
from trainguard.agent.ranks.launchers import LauncherWatch

from .conftest import HERE


def torchrun(tmp_path: Path) -> str:
    """mini_launcher.py under the name torchrun (a link: it finds rank_script.py beside
    its real path)."""
    link = tmp_path / "bin" / "torchrun"
    link.parent.mkdir(exist_ok=True)
    if not link.exists():
        link.symlink_to(HERE / "mini_launcher.py")
    return str(link)


def states(node: Any) -> dict[int, tuple[str, str, int | None, int | None, int]]:
    return {
        s.pid: (s.job, s.state, s.min_nodes, s.max_nodes, s.ranks)
        for s in node.local.launchers.scan()
    }


def test_the_watch_tells_active_launchers_from_spares_and_skips_other_nodes(
    make_node: Any, spawn: Any, tmp_path: Path
) -> None:
    node = make_node()
    sock = node.local.socket_path
    run = torchrun(tmp_path)
    # Its restart held back, so its workers' exit leaves it between two rounds for a while.
    active = spawn([run, "2"], sock, PET_NNODES="2:3", MINI_LAUNCHER_RESTART_DELAY="600")
    spare = spawn([run, "0"], sock, PET_NNODES="2:3")
    spawn([run, "0"], tmp_path / "other-node.sock", PET_NNODES="2:3")  # another agent's
    want = {
        active.pid: ("job1", "active", 2, 3, 2),
        spare.pid: ("job1", "spare", 2, 3, 0),
    }
    wait_for(lambda: states(node) == want, 30, 0.2)
    # Its workers gone (one killed: the launcher ends the other and waits to restart).
    (worker, *_) = [r.pid for r in node.local.job_ranks("job1")]
    os.kill(worker, signal.SIGKILL)
    want[active.pid] = ("job1", "restarting", 2, 3, 0)
    wait_for(lambda: states(node) == want, 30, 0.2)


def test_the_list_is_sent_when_it_changes_and_every_resend_interval(
    make_node: Any, spawn: Any, tmp_path: Path
) -> None:
    node = make_node()
    spare = spawn([torchrun(tmp_path), "0"], node.local.socket_path, PET_NNODES="2")
    now = [0.0]
    watch = LauncherWatch(
        node.local.socket_path, lambda: [], scan_s=0.0, resend_s=30.0, monotonic=lambda: now[0]
    )
    first = wait_for(watch.provider, 30, 0.2)
    assert [(s.pid, s.state, s.min_nodes, s.max_nodes) for s in first] == [
        (spare.pid, "spare", 2, 2)
    ]
    now[0] += 10
    assert watch.provider() is None  # unchanged, not yet due
    now[0] += 20
    assert watch.provider() == first  # due again
    spare.kill()
    spare.wait()
    now[0] += 1
    assert watch.provider() == []  # changed: sent at once, empty
