"""The SDK warns (once, local rank 0) when torchrun restarts a job on the store of its
previous generation: the cause of the "Connection refused" restarts under plain torchrun
(docs/restarts.md, "Plain torchrun restarts"; tests/restarts/torchrun_repro.py)."""

from __future__ import annotations

from trainguard import sdk

# What torch 2.13's elastic agent puts in a worker's environment (local_elastic_agent.py,
# _start_workers), for `torchrun --max-restarts 3` with the c10d rendezvous.
TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "exp-1",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_MAX_RESTARTS": "3",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "RANK": "0",
    "WORLD_SIZE": "2",
}


def test_torchrun_restarting_on_a_shared_store_is_warned_about() -> None:
    line = sdk.shared_store_warning(TORCHRUN)
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in line and "docs/restarts.md" in line


def test_the_recommended_line_no_restarts_and_ft_launcher_are_not() -> None:
    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: the workers get a fresh store per round
    assert sdk.shared_store_warning({**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "False"}) == ""
    assert sdk.shared_store_warning({**TORCHRUN, "TORCHELASTIC_MAX_RESTARTS": "0"}) == ""
    ft = {**TORCHRUN, "FT_LAUNCHER_IPC_SOCKET": "/tmp/ft.sock"}
    assert sdk.shared_store_warning(ft) == ""
    assert sdk.shared_store_warning({"RANK": "0"}) == ""
    assert sdk.shared_store_warning({**TORCHRUN, "TORCHELASTIC_MAX_RESTARTS": "x"}) == ""
