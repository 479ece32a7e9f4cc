"""Uncaught exceptions and the exit code: what ends a rank is reported before it dies.

An exception that leaves a step, or that nothing catches (sys.excepthook,
threading.excepthook; the previous hooks still run), is reported once; sys.exit()
records its exit code for the goodbye."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainguard.sdk.session import Session

_installed = False
_reported_ids: deque[int] = deque(maxlen=64)  # exceptions that take no attribute


def first_report(exc: BaseException) -> bool:
    """True the first time an exception object is seen (no reference to it is kept: its
    frames hold the training state, gloo's context among them)."""
    try:
        if getattr(exc, "_trainguard_reported", False):
            return False
        exc._trainguard_reported = True  # type: ignore[attr-defined]  # a marker on the exception object
        return True
    except Exception:
        if id(exc) in _reported_ids:
            return False
        _reported_ids.append(id(exc))
        return True


def exit_code(status: object) -> int:
    """The process exit code SystemExit(status) gives."""
    if status is None:
        return 0
    if isinstance(status, int):
        return status & 0xFF
    return 1


def install(live: Callable[[], Session | None]) -> None:
    """Route uncaught exceptions and sys.exit() to the session `live()` returns (None:
    nowhere), once per process; the hooks in place before still run after ours."""
    global _installed
    if _installed:
        return
    _installed = True
    previous_hook, previous_thread_hook, real_exit = sys.excepthook, threading.excepthook, sys.exit

    def excepthook(tp: type[BaseException], value: BaseException, tb: Any) -> None:
        with contextlib.suppress(Exception):
            if (s := live()) is not None:
                s._uncaught(value, None)
        previous_hook(tp, value, tb)

    def thread_excepthook(args: Any) -> None:
        with contextlib.suppress(Exception):
            if (s := live()) is not None and args.exc_value is not None:
                s._uncaught(args.exc_value, args.thread)
        previous_thread_hook(args)

    def recording_exit(status: object = None) -> None:
        if (s := live()) is not None and threading.current_thread() is threading.main_thread():
            s.exit_code = exit_code(status)
        real_exit(status)  # type: ignore[arg-type]  # sys.exit takes any object

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
    sys.exit = recording_exit  # type: ignore[assignment]  # a wrapper, returns only if sys.exit does
