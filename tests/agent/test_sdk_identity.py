"""The SDK's job identity, launcher detection and socket candidates, from the environments
the launchers really give their workers (torch.distributed.elastic's and NVRx
ft_launcher's worker_env, Slurm's task variables)."""

from __future__ import annotations

import os
import sys
from typing import Any

import msgspec
import pytest

from trainguard import sdk
from trainguard.protocol.wire import RankStatus

UUID = "3f2a1c4d-1b2c-4d5e-8f90-0123456789ab"


def torchrun_env(
    run_id: str = "none", nodes: int = 1, restart: int = 0, **extra: str
) -> dict[str, str]:
    """What torchrun (torch 2.13 LocalElasticAgent._start_workers) puts in a worker's env."""
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "GROUP_RANK": "0",
        "ROLE_RANK": "0",
        "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": "2",
        "WORLD_SIZE": str(2 * nodes),
        "GROUP_WORLD_SIZE": str(nodes),
        "ROLE_WORLD_SIZE": str(2 * nodes),
        "MASTER_ADDR": "node-a.cluster",
        "MASTER_PORT": "41234",
        "TORCHELASTIC_RESTART_COUNT": str(restart),
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        **extra,
    }


FT = {
    "FT_LAUNCHER_IPC_SOCKET": "/tmp/_ft_launcher7.socket",
    "FT_RANK_MONITOR_IPC_SOCKET": "/tmp/_ft_launcher7_rmon0.socket",
}


def ident(env: dict[str, str], **kw: object) -> sdk.JobIdentity:
    kw.setdefault("argv0", "/home/me/train.py")
    kw.setdefault("pid", 1000)
    kw.setdefault("ppid", 900)
    kw.setdefault("host", "gpu-1")
    return sdk.job_identity(env, **kw)  # type: ignore[arg-type]  # each test passes the keywords' types


def is_wire_name(name: str) -> bool:
    try:
        msgspec.convert({"job": name, "rank": 0, "pid": 1, "display_name": name}, RankStatus)
    except msgspec.ValidationError:
        return False
    return True


@pytest.mark.parametrize(
    ("env", "launcher"),
    [
        ({}, "none"),
        (torchrun_env(), "torchrun"),
        ({**torchrun_env(), **FT}, "ft_launcher"),
        ({"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3"}, "slurm"),
        ({**torchrun_env(), "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"}, "torchrun"),
    ],
)
def test_the_launcher_is_read_from_the_environment(env: Any, launcher: Any) -> None:
    assert sdk.launcher_from_env(env) == launcher
    assert ident(env).launcher == launcher


def test_trainguard_job_names_the_job_and_its_display() -> None:
    env = {**torchrun_env(UUID), "SLURM_JOB_ID": "77", "TRAINGUARD_JOB": "llama 70b/run"}
    job = ident(env)
    assert (job.job, job.display_name, job.source) == (
        "llama-70b-run",
        "llama-70b-run",
        "TRAINGUARD_JOB",
    )
    named = ident({**env, "TRAINGUARD_JOB_NAME": "Llama nightly"})
    assert (named.job, named.display_name) == ("llama-70b-run", "Llama-nightly")


def test_slurm_names_the_job_with_its_step_under_srun() -> None:
    srun = {"SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "2", **torchrun_env(UUID)}
    job = ident(srun)
    assert (job.job, job.display_name, job.source) == ("123456.2", "train-123456.2", "slurm")
    # the batch script itself (step "batch" = 0xfffffffe): the job alone
    batch = ident({"SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "4294967294"})
    assert (batch.job, batch.launcher) == ("123456", "slurm")


def test_the_launchers_run_id_names_the_job_unless_it_is_the_default() -> None:
    job = ident(torchrun_env("exp-42"))
    assert (job.job, job.display_name, job.source) == ("exp-42", "train-exp-42", "run_id")
    # torchrun --standalone, or a single-node torchrun without --rdzv-id: a UUID
    uuid = ident(torchrun_env(UUID))
    assert (uuid.job, uuid.display_name) == (UUID, "train-3f2a1c4d")
    long = ident(torchrun_env("a-rather-long-rendezvous-id-for-this-run"))
    assert long.display_name.startswith("train-") and len(long.display_name) == len("train-") + 8
    assert ident(torchrun_env("none")).source != "run_id"
    assert ident(torchrun_env("NONE")).source != "run_id"


def test_without_an_id_ranks_of_several_nodes_share_the_master_address() -> None:
    # `torchrun --rdzv-backend c10d --rdzv-endpoint ...` without --rdzv-id: run id "none"
    a = ident(torchrun_env(nodes=2), host="gpu-1", pid=11, ppid=10)
    b = ident(torchrun_env(nodes=2, restart=1, RANK="3"), host="gpu-2", pid=57, ppid=50)
    assert a.job == b.job and a.source == "master_address"
    assert a.job.startswith("train-") and a.display_name == a.job
    other = ident(torchrun_env(nodes=2, MASTER_PORT="41235"), host="gpu-1")
    assert other.job != a.job


def test_without_an_id_ranks_of_one_node_share_their_launcher_across_restarts() -> None:
    first = ident({**torchrun_env(), **FT}, pid=11, ppid=10)
    sibling = ident({**torchrun_env(RANK="1", LOCAL_RANK="1"), **FT}, pid=12, ppid=10)
    restarted = ident({**torchrun_env(restart=2), **FT}, pid=31, ppid=10)
    assert first.job == sibling.job == restarted.job and first.source == "launcher_process"
    assert ident({**torchrun_env(), **FT}, pid=11, ppid=99).job != first.job  # another launch
    assert ident({**torchrun_env(), **FT}, ppid=10, host="gpu-2").job != first.job


def test_a_plain_python_process_is_a_job_of_its_own() -> None:
    job = ident({}, pid=4242)
    assert (job.launcher, job.source) == ("none", "process")
    assert job.job.startswith("train-") and len(job.job) == len("train-") + 12
    assert job.display_name == job.job
    assert ident({}, pid=4243).job != job.job
    # processes started together by torch.multiprocessing.spawn share their parent
    spawned = {"WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}
    r0, r1 = ident({**spawned, "RANK": "0"}, pid=5), ident({**spawned, "RANK": "1"}, pid=6)
    assert r0.job == r1.job and r0.source == "launcher_process"


def test_this_process_gets_a_name_from_its_real_pid_and_start_time() -> None:
    here = sdk.job_identity({}, argv0=sys.argv[0])
    assert here == sdk.job_identity({}, argv0=sys.argv[0])
    assert here.source == "process" and is_wire_name(here.job)


@pytest.mark.parametrize(
    ("argv0", "script"),
    [
        ("/home/me/train.py", "train"),
        ("/opt/pkg/__main__.py", "pkg"),
        ("-c", "python"),
        ("", "python"),
        ("/x/my model (v2).py", "my-model--v2"),
        ("/x/_private.py", "private"),
    ],
)
def test_the_display_name_starts_with_the_script_name(argv0: Any, script: Any) -> None:
    job = ident(torchrun_env("r1"), argv0=argv0)
    assert job.display_name == f"{script}-r1"
    assert is_wire_name(job.display_name) and is_wire_name(job.job)


@pytest.mark.parametrize("raw", ["/leading", "_x", "a" * 300, "é-accented", "ok:1@host"])
def test_every_name_is_a_wire_name(raw: Any) -> None:
    job = ident({"TRAINGUARD_JOB": raw})
    assert is_wire_name(job.job) and is_wire_name(job.display_name)


def test_socket_candidates_are_one_per_host_and_overridable(
    monkeypatch: Any, tmp_path: Any
) -> None:
    uid = os.getuid()
    env = {"XDG_RUNTIME_DIR": f"/run/user/{uid}"}
    assert sdk.socket_candidates(env) == [
        "/run/trainguard/agent.sock",
        f"/run/user/{uid}/trainguard/agent.sock",
        f"/tmp/trainguard-{uid}/agent.sock",
    ]
    assert sdk.socket_candidates({})[1] == f"/run/user/{uid}/trainguard/agent.sock"
    dirs = {"TRAINGUARD_SOCKET_DIRS": f"{tmp_path}/a:{tmp_path}/b"}
    assert sdk.socket_candidates(dirs) == [f"{tmp_path}/a/agent.sock", f"{tmp_path}/b/agent.sock"]
    path, why = sdk.find_socket(dirs)
    assert path is None and why.count("no such file") == 2
    explicit = {**dirs, "TRAINGUARD_AGENT_SOCKET": f"{tmp_path}/mine.sock"}
    path, why = sdk.find_socket(explicit)
    assert path == f"{tmp_path}/mine.sock" and "TRAINGUARD_AGENT_SOCKET" in why


def test_no_wrapper_is_seen_outside_nvrx() -> None:
    assert sdk.under_wrapper() is False
