"""In-process restarts on the rank's side.

The agent's `Restart` request sets a flag; the step hook raises `RestartRequested` at the
next step boundary. A rank that stays inside one step for longer than `signal_after`
seconds after the request gets SIGUSR1 through signal.pthread_kill; the handler raises in
the main thread. Both are ordinary exceptions in the training function, so NVRx's
inprocess.Wrapper restarts every rank. (PyThreadState_SetAsyncExc is never used: NVRx's
progress watchdog swallows such exceptions.)"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from trainguard.protocol.messages import (
    Message,
    Rejected,
    Restart,
    RestartRaised,
    RestartReceived,
    decode_from_agent,
)


class RestartRequested(Exception):
    """Raised inside the training function when the agent asked for an in-process restart."""


class Restarts:
    """One session's restart requests: set by its listener thread, served by the step
    hook on the training thread (`pending`, `in_step`) or by SIGUSR1."""

    def __init__(
        self,
        job: str,
        signal_after: float,
        send: Callable[[Message], bool],
        closed: threading.Event,
        on_raise: Callable[[], None],
    ) -> None:
        """`send`: to the agent; `closed`: set when the session ends; `on_raise`: called
        as a restart is raised, before the exception leaves."""
        self.job = job
        self.signal_after = signal_after
        self.pending = False
        self.in_step = False
        self.request_id = ""
        self.reason = ""
        self.requests = 0
        self.signal_installed = False
        self._send = send
        self._closed = closed
        self._on_raise = on_raise
        self._main_ident = threading.main_thread().ident

    def install_signal_handler(self) -> None:
        """SIGUSR1 raises a pending restart inside a step (handlers are the main thread's)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, self._on_signal)
            self.signal_installed = True

    def listen(self, receive: Callable[[], bytes | None]) -> None:
        """The listener thread: the agent's requests for this job, until the session ends
        (`receive`: the next datagram, b"" for none yet, None once the socket closed)."""
        while not self._closed.is_set():
            data = receive()
            if data is None:
                return
            if not data:
                continue
            try:
                msg = decode_from_agent(data)
            except Rejected:
                continue  # another protocol version's, or no agent's: nothing to do
            if isinstance(msg, Restart) and msg.job in (None, self.job):
                self.request(msg.request_id, msg.reason)

    def request(self, request_id: str, reason: str) -> None:
        self.requests += 1
        self.request_id = request_id
        self.reason = reason
        self.pending = True
        self._send(RestartReceived(request_id=request_id, ts=time.time()))
        if self.signal_installed and self._main_ident is not None:
            threading.Thread(target=self._signal_if_stuck, name="tg-sdk-nudge", daemon=True).start()

    def raise_now(self) -> NoReturn:
        """Serve the pending request: tell the agent, raise RestartRequested."""
        self.pending = False
        self._on_raise()
        self._send(RestartRaised(request_id=self.request_id, ts=time.time()))
        raise RestartRequested(self.reason or "restart requested by trainguard")

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Raise only inside a step: anywhere else (NVRx's own restart code, the checkpoint
        # writer) the flag stays set and the next step boundary raises.
        if self.pending and self.in_step:
            self.in_step = False
            self.raise_now()

    def _signal_if_stuck(self) -> None:
        """A rank that does not reach a step boundary within signal_after gets SIGUSR1."""
        deadline = time.monotonic() + self.signal_after
        while self.pending and not self._closed.is_set():
            if time.monotonic() >= deadline:
                if self.in_step and self._main_ident is not None:
                    signal.pthread_kill(self._main_ident, signal.SIGUSR1)
                return
            time.sleep(0.01)
