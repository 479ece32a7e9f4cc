"""`tg.compute()` marks a rank's own work in a step; it travels with the step so straggler
scores can ignore the wait in collectives."""

from __future__ import annotations

from tests.support import wait_for

RANK = """
import time
from trainguard import sdk
tg = sdk.attach()
for n in range(10):
    with tg.step(n):
        with tg.compute():
            time.sleep(0.02)
        time.sleep(0.03)          # the wait in a collective: not compute
        with tg.compute():
            time.sleep(0.01)
with tg.step(10):                 # a step without sections reports no compute
    time.sleep(0.01)
tg.close()
"""


def test_compute_sections_travel_with_their_step(make_node, spawn) -> None:
    node = make_node()
    p = spawn(["-c", RANK], node.local.socket_path, RANK="1", WORLD_SIZE="2")
    wait_for(lambda: len(node.collect().steps) == 11, timeout=30)
    assert p.wait(timeout=10) == 0
    by_step = {s.step: s for s in node.steps}
    for n in range(10):
        s = by_step[n]
        assert 0.03 <= s.compute < s.end - s.start  # both sections, not the wait
    assert by_step[10].compute is None
