"""The launcher command lines the SDK (its timeouts) and the agent (the job's shape) both
read with trainguard.protocol.launchers: which launcher, its job, its --nnodes."""

from __future__ import annotations

import pytest

from trainguard.protocol.launchers import launcher_job, nnodes, parse_launcher

PY = "/usr/bin/python3"


@pytest.mark.parametrize(
    ("argv", "launcher"),
    [
        (["/venv/bin/torchrun", "--nnodes", "2", "train.py"], "torchrun"),
        ([PY, "/venv/bin/torchrun", "train.py"], "torchrun"),
        ([PY, "-u", "-m", "torch.distributed.run", "train.py"], "torchrun"),
        ([PY, "/venv/bin/ft_launcher", "train.py"], "ft_launcher"),
        ([PY, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher", "t.py"], "ft_launcher"),
        # a launcher's name elsewhere is not this process's
        (["timeout", "60", "torchrun", "train.py"], None),
        ([PY, "train.py", "torchrun"], None),
        ([PY, "-m", "pytest", "torchrun"], None),
        (["/bin/bash", "-c", "torchrun train.py"], None),
    ],
)
def test_which_launcher_a_command_line_runs(argv: list[str], launcher: str | None) -> None:
    assert parse_launcher(argv).launcher == launcher


def test_options_stop_at_the_training_script() -> None:
    line = parse_launcher(
        [PY, "/venv/bin/torchrun", "--standalone", "--nnodes=1:4", "--rdzv_id", "j7",
         "train.py", "--nnodes", "9", "--rdzv-id", "theirs"]
    )  # fmt: skip
    assert line.options == {"--standalone": "", "--nnodes": "1:4", "--rdzv_id": "j7"}
    assert nnodes(line, {}) == (1, 4)
    assert launcher_job(line, {}) == "j7"


@pytest.mark.parametrize(
    ("flags", "env", "span"),
    [
        (["--nnodes", "2"], {}, (2, 2)),
        (["--nnodes", "2:3"], {}, (2, 3)),
        ([], {"PET_NNODES": "1:8"}, (1, 8)),
        ([], {}, None),  # torchrun's default: one node, nothing said
        (["--nnodes", "3:2"], {}, None),  # no node count
        (["--nnodes", "0"], {}, None),
        (["--nnodes", "two"], {}, None),
    ],
)
def test_nnodes_as_min_and_max(
    flags: list[str], env: dict[str, str], span: tuple[int, int] | None
) -> None:
    assert nnodes(parse_launcher(["torchrun", *flags, "train.py"]), env) == span


@pytest.mark.parametrize(
    ("flags", "env", "job"),
    [
        (["--rdzv-id", "run-1"], {}, "run-1"),
        (["--rdzv-id", "run-1"], {"TRAINGUARD_JOB": "mine"}, "mine"),
        (["--rdzv-id", "run-1"], {"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0"}, "1234.0"),
        (["--rdzv-id", "run-1"], {"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "4294967294"}, "1234"),
        ([], {"PET_RDZV_ID": "from-env"}, "from-env"),
        (["--rdzv-id", "none"], {}, None),  # torchrun's default: every job's, no name
        ([], {}, None),
    ],
)
def test_a_launchers_job_is_named_by_the_sdks_rule(
    flags: list[str], env: dict[str, str], job: str | None
) -> None:
    assert launcher_job(parse_launcher(["torchrun", *flags, "train.py"]), env) == job
