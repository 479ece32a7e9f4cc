"""What each rank declares through the SDK (its launcher, whether NVRx's in-process
Wrapper runs it, the job's display name) reaches the agent's RankStatus and the wire."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.support import free_port, wait_for
from trainguard import sdk
from trainguard.protocol.wire import Batch, decode_batch, encode

from .conftest import HERE, ROOT

RANK = str(HERE / "rank_script.py")

# Attached outside the Wrapper, as examples/train_demo.py does: detection must find the
# Wrapper later, from the heartbeat thread, without any call inside the wrapped function.
UNDER_WRAPPER = """
import os, sys, time
from datetime import timedelta as td
from nvidia_resiliency_ext import inprocess
from trainguard import sdk

tg = sdk.attach(heartbeat_interval=0.1)
print("attached", tg.in_process, flush=True)

def fn(call_wrapper: inprocess.CallWrapper | None = None):
    # no exception in here: the Wrapper would restart the function instead of failing
    deadline, n = time.monotonic() + 30, 0
    while not tg.in_process and time.monotonic() < deadline:
        with tg.step(n):  # the heartbeat thread looks for the Wrapper on this stack
            time.sleep(0.01)
        n += 1
    tg.flush()
    return tg.in_process

s = td(seconds=1)
wrapper = inprocess.Wrapper(
    store_kwargs={"port": int(os.environ["STORE_PORT"])},
    monitor_process_logfile=os.path.join(os.environ["LOGDIR"], "monitor-{rank}.log"),
    soft_timeout=15 * s, hard_timeout=25 * s, heartbeat_timeout=10 * s,
    barrier_timeout=60 * s, completion_timeout=60 * s, termination_grace_time=2 * s,
    monitor_thread_interval=s / 10, monitor_process_interval=s / 10,
    progress_watchdog_interval=s / 10, heartbeat_interval=s / 2, last_call_wait=s / 10,
)
found = wrapper(fn)()
tg.finished()
sys.exit(0 if found else 5)
"""


def _status(node, pid):
    return next(s for s in node.local.rank_statuses() if s.pid == pid)


def test_the_launcher_and_an_explicit_in_process_reach_rank_status(
    make_node: Any, spawn: Any
) -> None:
    node = make_node()
    env = {"TORCHELASTIC_RUN_ID": "none", "FT_LAUNCHER_IPC_SOCKET": "/tmp/_ft_launcher1.socket"}
    ft = spawn([RANK], node.local.socket_path, RANK="0", **env)  # declares in_process
    plain = spawn([RANK, "--detect"], node.local.socket_path, RANK="1", TORCHELASTIC_RUN_ID="r1")
    wait_for(lambda: {ft.pid, plain.pid} <= set(node.local.ranks), timeout=20)
    a, b = _status(node, ft.pid), _status(node, plain.pid)
    assert (a.launcher, a.in_process, a.display_name) == ("ft_launcher", True, "job1")
    assert (b.launcher, b.in_process) == ("torchrun", False)
    (start,) = [e for e in node.kinds("rank_start") if e.data["pid"] == ft.pid]
    assert start.data["launcher"] == "ft_launcher" and start.data["in_process"] is True
    # the fields survive the wire, as the backend decodes them
    batch = Batch(node="n1", agent_id="agent-0001", seq=1, sent_at=time.time(), ranks=[a, b])
    again = decode_batch(encode(batch)).ranks
    assert again is not None and again[0].in_process is True and again[1].launcher == "torchrun"


def test_the_launchers_restart_budget_reaches_rank_status_and_the_wire(
    make_node: Any, spawn: Any
) -> None:
    node = make_node()
    budget = {"TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RESTART_COUNT": "2"}
    ranked = spawn([RANK], node.local.socket_path, RANK="0", TORCHELASTIC_RUN_ID="r1", **budget)
    odd = {"TORCHELASTIC_MAX_RESTARTS": "three", "TORCHELASTIC_RESTART_COUNT": "two"}
    unknown = spawn([RANK], node.local.socket_path, RANK="1", TORCHELASTIC_RUN_ID="r1", **odd)
    wait_for(lambda: {ranked.pid, unknown.pid} <= set(node.local.ranks), timeout=20)
    a, b = _status(node, ranked.pid), _status(node, unknown.pid)
    assert (a.max_restarts, a.restart_count, a.attempt) == (3, 2, 2)
    assert (b.max_restarts, b.restart_count) == (None, None)  # not counts: unknown
    batch = Batch(node="n1", agent_id="agent-0001", seq=1, sent_at=time.time(), ranks=[a, b])
    raw = json.loads(encode(batch))["ranks"]
    assert (raw[0]["max_restarts"], raw[0]["restart_count"]) == (3, 2)
    assert "max_restarts" not in raw[1]  # omitted: an older backend reads the batch as before
    again = decode_batch(encode(batch)).ranks
    assert again is not None and (again[0].max_restarts, again[0].restart_count) == (3, 2)


def test_a_launchers_budget_is_read_from_the_environment() -> None:
    env = {"TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RESTART_COUNT": "2"}
    assert sdk.restart_budget_from_env(env) == (3, 2)
    assert sdk.restart_budget_from_env({}) == (None, None)


@pytest.mark.slow
def test_the_nvrx_wrapper_is_detected_from_outside_the_wrapped_function(
    make_node: Any, spawn: Any, tmp_path: Any
) -> None:
    node = make_node()
    store_port = free_port()
    p = spawn(
        ["-c", UNDER_WRAPPER],
        node.local.socket_path,
        RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        STORE_PORT=str(store_port),
        LOGDIR=str(tmp_path),
    )
    assert p.wait(timeout=90) == 0
    rec = node.local.ranks[p.pid]
    assert rec.in_process is True and rec.last_step is not None
    (start,) = [e for e in node.kinds("rank_start") if e.data["pid"] == p.pid]
    assert start.data["in_process"] is False  # attached before the Wrapper ran


def test_an_old_sdk_declares_nothing_and_a_bad_declaration_is_dropped(make_node: Any) -> None:
    node = make_node()
    old, bad, slashed = 1, os.getpid(), os.getppid()  # live processes, standing in for ranks
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        base = {"t": "hello", "job": "old", "rank": 0, "ts": time.time()}
        s.sendto(json.dumps({**base, "pid": old}).encode(), node.local.socket_path)
        wrong = {
            "launcher": "mpirun",
            "in_process": "yes",
            "display_name": "a/b c",
            "max_restarts": -1,
            "restart_count": "2",
        }
        s.sendto(
            json.dumps({**base, "rank": 1, "pid": bad, **wrong}).encode(), node.local.socket_path
        )
        s.sendto(
            json.dumps({**base, "job": "a/b", "pid": slashed}).encode(), node.local.socket_path
        )
        wait_for(lambda: {old, bad, slashed} <= set(node.local.ranks), 10)
    finally:
        s.close()
    statuses = {st.pid: st for st in node.local.rank_statuses()}
    assert statuses[slashed].job == "a-b"  # an old SDK let "/" through: made a wire name
    for pid in (old, bad):
        st = statuses[pid]
        assert (st.launcher, st.in_process, st.display_name) == (None, None, None)
        assert (st.max_restarts, st.restart_count) == (None, None)
    batch = Batch(
        node="n1", agent_id="agent-0001", seq=1, sent_at=time.time(), ranks=[*statuses.values()]
    )
    assert len(decode_batch(encode(batch)).ranks or []) == 3


def test_a_session_declares_what_attach_was_told(tmp_path: Any) -> None:
    tg = sdk.attach(
        job="j1",
        socket_path=str(tmp_path / "absent.sock"),
        install_signal_handler=False,
        in_process=True,
        launcher="slurm",
        display_name="nightly run",
    )
    try:
        assert (tg.launcher, tg.in_process, tg.display_name) == ("slurm", True, "nightly-run")
    finally:
        tg.close()
    with pytest.raises(ValueError, match="launcher must be one of"):
        sdk.attach(job="j1", socket_path=str(tmp_path / "a.sock"), launcher="mpirun")


# The same Wrapper in a process with LOCAL_RANK, as every launcher's worker has it: NVRx
# 0.5+ then chains its NVML health checks into the Wrapper (docs/restarts.md, "NVRx
# versions"), and on a host without NVML each in-process restart would end the ranks.
WRAPPER_WITH_LOCAL_RANK = (
    UNDER_WRAPPER.split("def fn(")[0]
    + """
import json

def fn(call_wrapper: inprocess.CallWrapper | None = None):
    blocker = sdk.in_process_blocker(sdk.running_wrapper())
    for n in range(30):  # 0.3 s of steps: three heartbeats, each of which detects
        with tg.step(n):
            time.sleep(0.01)
    print(json.dumps({"blocker": blocker, "in_process": tg.in_process}), flush=True)

s = td(seconds=1)
"""
    + UNDER_WRAPPER.split("s = td(seconds=1)\n")[1].split("found = ")[0]
    + """
wrapper(fn)()
tg.finished()
"""
)


def nvrx_chains_nvml_checks() -> bool:
    """The installed NVRx's Wrapper adds NVML checks when LOCAL_RANK is set (0.5+)."""
    from nvidia_resiliency_ext.inprocess import wrap

    return hasattr(wrap.Wrapper, "_construct_restart_health_check")


@pytest.mark.slow
def test_a_wrapper_whose_nvml_checks_cannot_run_here_is_no_in_process_capability(
    make_node: Any, tmp_path: Any
) -> None:
    node = make_node()
    env = dict(
        os.environ,
        TRAINGUARD_AGENT_SOCKET=str(node.local.socket_path),
        TRAINGUARD_JOB="job1",
        PYTHONPATH=str(ROOT),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        STORE_PORT=str(free_port()),
        LOGDIR=str(tmp_path),
    )
    out = subprocess.run(
        [sys.executable, "-c", WRAPPER_WITH_LOCAL_RANK],
        env=env, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    said = [line for line in out.stderr.splitlines() if "in-process restarts are off" in line]
    if nvrx_chains_nvml_checks() and sdk.nvml_missing() is not None:  # NVRx 0.5+ on CPU
        assert "ChainedGPUHealthCheck" in seen["blocker"]
        assert "NVML does not load here" in seen["blocker"]
        assert seen["in_process"] is False
        assert len(said) == 1, out.stderr[-3000:]  # said once, not at every heartbeat
    else:  # NVRx 0.4.1, or a GPU host
        assert seen == {"blocker": None, "in_process": True}
        assert said == []
