"""The agent's launcher watch (agent/ranks/launchers.py) against real processes: the
torch-free launcher (mini_launcher.py) run under the name `torchrun`, so /proc shows a
torchrun command line; its ranks register with the real SDK server. One with workers is
active, one started with none waits as a spare, one of another agent's socket is not
this node's; then the watch's list reaches a real backend over HTTP and reads back as the
job's shape."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from tests.support import TOKEN, wait_for
from trainguard.agent.ranks.launchers import LauncherWatch
from trainguard.agent.uplink.sender import Uplink

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


def test_a_spare_reaches_the_backend_over_http_and_reads_as_the_jobs_shape(
    make_node: Any, spawn: Any, tmp_path: Path, live_url: str, client: Any
) -> None:
    node = make_node("n2")
    spare = spawn([torchrun(tmp_path), "0"], node.local.socket_path, PET_NNODES="1:2")
    node.local._listing_from = 0.0  # no agent restart to settle from
    cfg = node.agent.config.model_copy(
        update={"server": live_url, "token": TOKEN, "spool_dir": tmp_path / "spool-http"}
    )
    uplink = Uplink(cfg, node.agent.outbox)
    uplink.tick()  # the first answer says the backend stores launchers
    assert node.agent.outbox.want_launchers

    def shape() -> dict[str, Any] | None:
        uplink.tick()
        r = client.get("/api/v1/jobs/job1")
        return r.json()["shape"] if r.status_code == 200 else None

    got = wait_for(lambda: (s := shape()) and s["spares"] and s, 30, 0.2)
    assert [(s["node"], s["pid"], s["available"]) for s in got["spares"]] == [
        ("n2", spare.pid, True)
    ]
    assert (got["active"], got["spare_capacity"], got["min_nodes"], got["max_nodes"]) == (
        [],
        1,
        1,
        2,
    )
    assert got["elastic"] is True
    (listed,) = [j for j in client.get("/api/v1/jobs").json() if j["name"] == "job1"]
    assert listed["spare_capacity"] == 1


FORKING = """import os, time
if os.fork() == 0:  # like NVRx's rank monitor: a fork, the same command line
    time.sleep(600)
else:
    time.sleep(600)
"""


def test_a_launchers_own_forks_are_not_launchers_of_their_own(
    make_node: Any, spawn: Any, tmp_path: Path
) -> None:
    node = make_node()
    script = tmp_path / "bin" / "ft_launcher"
    script.parent.mkdir(exist_ok=True)
    script.write_text(FORKING)
    launcher = spawn([str(script), "--nnodes", "2", "--rdzv-id", "job1", "train.py"],
                     node.local.socket_path)  # fmt: skip
    forked = wait_for(lambda: _children(launcher.pid), 30, 0.1)
    assert forked  # the fork runs, with the launcher's command line
    listed = wait_for(lambda: node.local.launchers.scan(), 30, 0.2)
    assert [(s.pid, s.launcher, s.state, s.max_nodes) for s in listed] == [
        (launcher.pid, "ft_launcher", "spare", 2)
    ]


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []
