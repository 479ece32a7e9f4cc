"""Run a training script with faults a test (or `trainguard bench gpu`) asks for while it
runs, the script itself unchanged: `python inject.py SCRIPT [ARGS...]` (as the launcher's
training script).

A test writes `<TRAINGUARD_TEST_FAULTS>/<kind>.<rank>`; the rank of that global rank takes
the file at the start of its next step (`with tg.step(n):`, the SDK's own step context)
and, inside the step:
- `exception`: raises `InjectedFault`, as a bug in the step would;
- `hang`: sleeps in 50 ms slices for up to `TRAINGUARD_TEST_HANG_S` (120 s): heartbeats
  go on, steps stop; only a restart (the launcher ending the process, the Wrapper
  interrupting it) ends it;
- `xid`: asks the node's agent to inject XID 79 (the GPU fell off the bus) on the rank's
  simulated GPU (its local rank), and trains on, as a CPU job beside it does.

A SIGKILL needs no help from inside: the test kills the rank's pid. The file is removed
before the fault fires, so a restarted generation does not fire it again.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trainguard import sdk


class InjectedFault(RuntimeError):
    """The exception a test asked for."""


def _take(folder: str, kind: str, rank: int) -> bool:
    try:
        os.remove(os.path.join(folder, f"{kind}.{rank}"))
    except OSError:
        return False
    return True


class _FaultyStep:
    __slots__ = ("_inner", "_session")

    def __init__(self, inner: Any, session: sdk.Session) -> None:
        self._inner, self._session = inner, session

    def __enter__(self) -> Any:
        entered = self._inner.__enter__()
        folder = os.environ.get("TRAINGUARD_TEST_FAULTS")
        if folder:
            rank = self._session.rank
            try:
                if _take(folder, "exception", rank):
                    raise InjectedFault(f"injected exception on rank {rank}")
                if _take(folder, "xid", rank):
                    self._session.inject_xid(self._session.local_rank, 79, "injected by a test")
                if _take(folder, "hang", rank):
                    deadline = time.monotonic() + float(
                        os.environ.get("TRAINGUARD_TEST_HANG_S", "120")
                    )
                    while time.monotonic() < deadline:
                        time.sleep(0.05)
            except BaseException as exc:  # leaves the step as it would from its body
                self._inner.__exit__(type(exc), exc, exc.__traceback__)
                raise
        return entered

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        return self._inner.__exit__(exc_type, exc, tb)


def install() -> None:
    step = sdk.Session.step

    def faulty_step(self: sdk.Session, n: int) -> Any:
        return _FaultyStep(step(self, n), self)

    sdk.Session.step = faulty_step  # type: ignore[method-assign]  # the fault is a patched method


def main() -> None:
    script = sys.argv[1]
    sys.argv = sys.argv[1:]  # the script sees its own name and arguments
    install()
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
