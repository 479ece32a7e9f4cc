"""A launcher's command line read the same way by the SDK (its timeouts, sdk/timeouts.py)
and by the agent (the job's shape: which launchers of which job run on its node,
agent/ranks/launchers.py): which launcher it is (torchrun, ft_launcher), the options it
was given before the training script, the job it runs and its `--nnodes`.

Standard library only (the SDK imports this in every training process)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import NamedTuple

# The launchers by program name (a console script: `.../bin/torchrun`) and by module
# (`python -m torch.distributed.run`).
LAUNCHER_NAMES = {"torchrun": "torchrun", "ft_launcher": "ft_launcher"}
LAUNCHER_MODULES = {
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torchrun",
    "nvidia_resiliency_ext.fault_tolerance.launcher": "ft_launcher",
}
# Launcher options that take no value (the first other word is the training script).
FLAGS = frozenset(
    {"--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path"}
)
# torchrun's and ft_launcher's --rdzv-id default: the same string for every job.
DEFAULT_RUN_IDS = frozenset({"", "none"})


class LauncherLine(NamedTuple):
    """What a launcher's command line says: which launcher (None: `argv` is none) and its
    options up to the training script, by the spelling given (`--rdzv-id`, `--rdzv_id`),
    the last one given winning; a flag has the value ""."""

    launcher: str | None
    options: dict[str, str]

    def option(self, *names: str) -> str | None:
        """The value of the first of `names` given (every spelling of one option)."""
        for name in names:
            if name in self.options:
                return self.options[name]
        return None


def parse_launcher(argv: Sequence[str]) -> LauncherLine:
    """`argv` as /proc/<pid>/cmdline has it: the launcher (`torchrun ...`), or the
    interpreter, its options and the launcher (`python -u -m torch.distributed.run ...`,
    `python .../bin/ft_launcher ...`); then its options, the script and the script's own
    arguments (which are not read). A launcher's name anywhere else (`timeout 60 torchrun`,
    `python train.py torchrun`) is not this process's."""
    which, start = None, 0
    for i, arg in enumerate(argv):
        name = os.path.basename(arg)
        if name in LAUNCHER_NAMES:
            which, start = LAUNCHER_NAMES[name], i + 1
            break
        if arg in LAUNCHER_MODULES and i > 0 and argv[i - 1] == "-m":
            which, start = LAUNCHER_MODULES[arg], i + 1
            break
        if i > 0 and not arg.startswith("-") and argv[i - 1] not in ("-X", "-W"):
            return LauncherLine(None, {})  # the interpreter runs something else
    if which is None:
        return LauncherLine(None, {})
    found: dict[str, str] = {}
    i = start
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or arg == "--":
            break  # the training script: what follows is its own
        name, eq, value = arg.partition("=")
        if not eq and name not in FLAGS:
            value = argv[i + 1] if i + 1 < len(argv) else ""
            i += 1
        found[name] = value
        i += 1
    return LauncherLine(which, found)


def nnodes(line: LauncherLine, env: Mapping[str, str]) -> tuple[int, int] | None:
    """The launcher's `--nnodes` as (min, max): "2" is (2, 2), "1:4" is (1, 4); its
    `PET_NNODES` environment variable when the option is absent; None when neither says
    (torchrun's default, one node) or the value is no node count."""
    text = line.option("--nnodes")
    if text is None:
        text = env.get("PET_NNODES")
    if text is None:
        return None
    low, _, high = text.strip().partition(":")
    try:
        most = int(high or low)
        least = int(low)
    except ValueError:
        return None
    if not 1 <= least <= most <= 2**31 - 1:
        return None
    return least, most


def run_id(line: LauncherLine, env: Mapping[str, str]) -> str | None:
    """The launcher's rendezvous id (`--rdzv-id`, `--rdzv_id`, `PET_RDZV_ID`), which it
    gives its workers as TORCHELASTIC_RUN_ID; None for the default `none`."""
    text = line.option("--rdzv-id", "--rdzv_id")
    if text is None:
        text = env.get("PET_RDZV_ID", "")
    text = text.strip()
    return None if text.lower() in DEFAULT_RUN_IDS else text


def given_job(env: Mapping[str, str]) -> str | None:
    """The job named by the environment its workers inherit, before any launcher's id:
    TRAINGUARD_JOB, else Slurm's job id with the step under srun (`1234.0`); the first
    two rules of the SDK's `job_identity`, which calls this. None: neither is set."""
    explicit = env.get("TRAINGUARD_JOB", "").strip()
    if explicit:
        return explicit
    slurm_job = env.get("SLURM_JOB_ID", "").strip()
    if slurm_job:
        step = env.get("SLURM_STEP_ID", "").strip()
        # 0xFFFFFFF0 and above are the batch, extern and interactive steps, not srun's
        if step.isdigit() and int(step) < 0xFFFFFFF0:
            slurm_job = f"{slurm_job}.{step}"
        return slurm_job
    return None


def launcher_job(line: LauncherLine, env: Mapping[str, str]) -> str | None:
    """The job a launcher runs, named as its workers will name it (the SDK's
    `job_identity`, rules 1 to 3: TRAINGUARD_JOB, Slurm's job, the rendezvous id), before
    wire_name; None when only a rank could tell (a job with no id: its name derives from
    what the workers are given)."""
    return given_job(env) or run_id(line, env)
