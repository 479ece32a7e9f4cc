"""What NVRx 0.7 does differently by design, each with its own test (docs/restarts.md, "NVRx
versions"); `make test` runs this file on 0.4.1 and on 0.7.0. The Wrapper's NVML checks are
tested in test_capabilities.py; the launcher flags in test_launcher_flags.py."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from trainguard.backend import demojob

from .harness import launch_demo

CLOSED = "Permanently closing the rendezvous"


def same_host_guard() -> bool:
    """The installed ft_launcher refuses two launchers of a job on one host (0.7+)."""
    spec = importlib.util.find_spec("nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier")
    return (
        spec is not None
        and spec.origin is not None
        and (demojob.SIMULATED_NODES_ENV in Path(spec.origin).read_text())
    )


def test_only_launchers_that_imitate_several_nodes_get_the_simulation_switch() -> None:
    assert demojob.simulation_env(2) == {"NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE": "1"}
    assert demojob.simulation_env(1) == {}


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("switch", ["0", None])
def test_two_launchers_on_one_host_train_only_with_the_switch(
    tmp_path: Path, switch: str | None
) -> None:
    """Unset ("0" overrides what demojob sets), 0.7's rendezvous closes for good and both
    launchers exit; demojob's own setting lets them form round 0 and start workers."""
    if not same_host_guard():
        pytest.skip("this ft_launcher has no same-host guard (NVRx < 0.7)")
    env = {} if switch is None else {demojob.SIMULATED_NODES_ENV: switch}
    c = launch_demo(tmp_path, job="guard", steps=5, ckpt_every=100, env=env)
    try:
        codes = c.wait(150)
        if switch == "0":
            assert CLOSED in c.logs()
            assert all(code not in (0, None) for code in codes), codes
            assert c.kinds("rank_start") == []  # no worker ever started
        else:
            assert codes == [0, 0], c.logs()
            assert CLOSED not in c.logs()
            assert len(c.kinds("rank_start")) == 4
    finally:
        c.close()
    assert os.environ.get(demojob.SIMULATED_NODES_ENV) is None  # never set for this process
