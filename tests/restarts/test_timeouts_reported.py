"""The timeouts a rank reports (agent/sdk/timeouts.py) reach its agent's RankStatus with
trainguard's own beside them, under real launchers: torchrun and NVRx's ft_launcher (its
0.4.1 --ft-param-* and its 0.6+ --ft-*=value spellings in one line), a real gloo process
group, a real checkpoint section, NVRx's real rank monitor client and Wrapper."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import free_port, wait_for
from trainguard.backend.demojob import launcher_options
from trainguard.protocol.wire import Batch, decode_batch, encode

from .test_capabilities import UNDER_WRAPPER

TRAIN = """
import datetime, os, pathlib, time
import torch.distributed as dist
from trainguard import sdk

tg = sdk.attach(heartbeat_interval=0.1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=42))
with tg.checkpoint("save", 0):
    time.sleep(0.3)
client = None
if os.environ.get("FT_HEARTBEATS"):
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()
stop, n = pathlib.Path(os.environ["STOP_FILE"]), 0
while not stop.exists() and n < 6000:
    with tg.step(n):
        time.sleep(0.01)
        if client is not None:
            client.send_heartbeat()
    n += 1
tg.finished()
if client is not None:
    client.shutdown_workload_monitoring()
dist.destroy_process_group()
"""


def _launcher(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _timeouts(node: Any, want: str) -> dict[str, Any]:
    """The first live rank's reported timeouts, once they hold `want`."""

    def ready() -> dict[str, Any] | None:
        for s in node.local.rank_statuses():
            t = s.timeouts
            if s.alive and t is not None and getattr(t, want) is not None:
                return {k: getattr(t, k) for k in t.__struct_fields__}
        return None

    return wait_for(ready, timeout=120)


def _run(spawn: Any, node: Any, tmp_path: Path, line: list[str], **env: str) -> Any:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    stop = tmp_path / "stop"
    p = spawn([*line, str(script)], node.local.socket_path, STOP_FILE=str(stop), **env)
    return p, stop


@pytest.mark.slow
def test_torchrun_its_monitor_interval_the_gloo_timeout_and_a_save_reach_rank_status(
    make_node: Any, spawn: Any, tmp_path: Path
) -> None:
    node = make_node()
    line = [_launcher("torchrun"), "--standalone", "--nproc-per-node", "1",
            "--max-restarts", "0", "--monitor-interval", "0.7"]  # fmt: skip
    p, stop = _run(spawn, node, tmp_path, line, OMP_NUM_THREADS="1")
    t = _timeouts(node, "hang_s")
    stop.touch()
    assert p.wait(timeout=60) == 0
    assert t["monitor_interval_s"] == 0.7
    assert (t["collective_s"], t["collective_backend"]) == (42.0, "gloo")
    assert 0.3 <= t["checkpoint_save_s"] < 30
    assert t["first_step_s"] == 120.0 and t["hang_s"] >= 2.0  # the agent's own
    assert t["launcher_heartbeat_s"] is None  # torchrun has none
    # and they survive the wire as the backend decodes it
    status = [s for s in node.local.rank_statuses() if s.timeouts is not None]
    batch = Batch(node="n1", agent_id="agent-0001", seq=1, sent_at=1.0, ranks=status)
    again = decode_batch(encode(batch)).ranks
    assert again is not None and again[0].timeouts is not None
    assert again[0].timeouts.collective_s == 42.0


@pytest.mark.slow
def test_ft_launchers_heartbeat_timeouts_count_once_the_rank_sends_ft_heartbeats(
    make_node: Any, spawn: Any, tmp_path: Path
) -> None:
    node = make_node()
    head = _launcher("ft_launcher")
    if not Path(head).exists():
        pytest.skip("no ft_launcher (NVRx) in this environment")
    # 0.4.1's deprecated --ft-param-* (0.6 removed it) where the launcher has it, and the
    # 0.6+ spelling as --opt=value, in one line
    old = "--ft-param-initial_rank_heartbeat_timeout"
    initial = old if old in (launcher_options((head,)) or {}) else old.replace("param-", "")
    line = [head, "--standalone", "--nproc-per-node", "1", "--max-restarts", "0",
            "--ft-enable-nic-monitor", "false", initial, "600",
            "--ft-rank-heartbeat-timeout=300", "--ft-workload-check-interval", "2"]  # fmt: skip
    p, stop = _run(spawn, node, tmp_path, line, OMP_NUM_THREADS="1", FT_HEARTBEATS="1")
    t = _timeouts(node, "launcher_heartbeat_s")
    stop.touch()
    assert p.wait(timeout=60) == 0
    assert t["launcher_heartbeat_s"] == 300.0
    assert t["launcher_initial_heartbeat_s"] == 600.0
    assert t["launcher_check_interval_s"] == 2.0
    assert t["monitor_interval_s"] == 0.1  # the launcher's default
    assert t["collective_s"] == 42.0


@pytest.mark.slow
def test_without_ft_heartbeats_the_launchers_heartbeat_timeouts_do_not_count(
    make_node: Any, spawn: Any, tmp_path: Path
) -> None:
    node = make_node()
    line = [_launcher("ft_launcher"), "--standalone", "--nproc-per-node", "1",
            "--max-restarts", "0", "--ft-enable-nic-monitor", "false",
            "--ft-rank-heartbeat-timeout", "5"]  # fmt: skip
    if not Path(line[0]).exists():
        pytest.skip("no ft_launcher (NVRx) in this environment")
    p, stop = _run(spawn, node, tmp_path, line, OMP_NUM_THREADS="1")
    t = _timeouts(node, "hang_s")
    stop.touch()
    assert p.wait(timeout=60) == 0
    assert t["monitor_interval_s"] == 0.1 and t["collective_s"] == 42.0
    # NVRx checks them only for a rank connected to its rank monitor: none here
    assert t["launcher_heartbeat_s"] is None and t["launcher_initial_heartbeat_s"] is None


@pytest.mark.slow
def test_the_nvrx_wrappers_timeouts_reach_rank_status(
    make_node: Any, spawn: Any, tmp_path: Path
) -> None:
    node = make_node()
    p = spawn(
        ["-c", UNDER_WRAPPER],
        node.local.socket_path,
        RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        STORE_PORT=str(free_port()),
        LOGDIR=str(tmp_path),
    )
    assert p.wait(timeout=90) == 0
    t = node.local.ranks[p.pid].timeouts
    assert (t["wrapper_soft_s"], t["wrapper_hard_s"], t["wrapper_heartbeat_s"]) == (15, 25, 10)
    assert (t["wrapper_barrier_s"], t["wrapper_completion_s"]) == (60, 60)
    assert "launcher_heartbeat_s" not in t  # no launcher here


def test_an_odd_timeout_is_dropped_on_its_own_and_an_old_sdks_rank_reports_none(
    make_node: Any,
) -> None:
    node = make_node()
    odd, old = os.getpid(), os.getppid()  # live processes, standing in for ranks
    declared = {
        "collective_s": -5,  # refused by the wire: dropped
        "collective_backend": "x" * 1000,  # too long: dropped
        "wrapper_hard_s": True,  # no number: dropped
        "launcher_heartbeat_s": 1e300,  # beyond MAX_TIMEOUT_S: dropped
        "wrapper_soft_s": 60,  # kept
        "not_a_timeout": 3,  # unknown: dropped
    }
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        base = {"t": "hello", "job": "j", "ts": time.time()}
        hello = {**base, "rank": 0, "pid": odd, "timeouts": declared}
        s.sendto(json.dumps(hello).encode(), node.local.socket_path)
        s.sendto(json.dumps({**base, "rank": 1, "pid": old}).encode(), node.local.socket_path)
        wait_for(lambda: {odd, old} <= set(node.local.ranks), 10)
    finally:
        s.close()
    statuses = {st.pid: st for st in node.local.rank_statuses()}
    t = statuses[odd].timeouts
    assert t is not None and t.wrapper_soft_s == 60.0
    assert (t.collective_s, t.collective_backend, t.wrapper_hard_s) == (None, None, None)
    assert t.launcher_heartbeat_s is None
    assert t.first_step_s == 120.0  # the agent's own, for every live rank
    # an SDK from before timeouts: none on its status, so an older backend takes the batch
    assert statuses[old].timeouts is None
    batch = Batch(node="n1", agent_id="agent-0001", seq=1, sent_at=1.0, ranks=[*statuses.values()])
    assert len(decode_batch(encode(batch)).ranks or []) == 2  # the node's batch is accepted
