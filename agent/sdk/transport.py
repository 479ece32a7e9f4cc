"""The rank's datagram socket to its node's agent.

Sends never block (MSG_DONTWAIT): when no agent is known, the agent is gone or its
buffer is full, the datagram is dropped and counted; training never waits. The socket
has an abstract address (Linux: nothing to clean up, unique per process), which is where
the agent answers (a restart request)."""

from __future__ import annotations

import contextlib
import socket

from trainguard.protocol.messages import MAX_DATAGRAM, Message, Steps, StepTiming, encode


class Transport:
    def __init__(self, path: str | None, name: str) -> None:
        """`path`: the agent's socket (None: no agent known yet); `name`: this end's
        abstract address, unique to the process."""
        self.path = path
        self.sent = 0  # datagrams sent
        self.dropped = 0  # datagrams (steps: each step) that could not be sent
        self.forked = False  # in a forked child, which is not the rank: nothing is sent
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(f"\0{name}")
        self._sock.settimeout(0.5)

    def send(self, msg: Message) -> bool:
        """Send one message; False when it was dropped."""
        return self.send_bytes(encode(msg))

    def send_bytes(self, data: bytes) -> bool:
        if self.forked:
            return False
        if self.path is None:  # no agent found (yet)
            self.dropped += 1
            return False
        try:
            self._sock.sendto(data, socket.MSG_DONTWAIT, self.path)
        except OSError:  # no agent, agent gone, or its buffer full: drop and count
            self.dropped += 1
            return False
        self.sent += 1
        return True

    def send_steps(self, steps: list[StepTiming]) -> None:
        """Send steps in one datagram, or in halves while it would exceed MAX_DATAGRAM
        bytes (what the agent reads); a lost datagram counts each of its steps."""
        if self.forked:
            return
        data = encode(Steps(steps=steps))
        if len(data) > MAX_DATAGRAM and len(steps) > 1:
            half = len(steps) // 2
            self.send_steps(steps[:half])
            self.send_steps(steps[half:])
        elif not self.send_bytes(data) and not self.forked:
            self.dropped += len(steps) - 1

    def receive(self) -> bytes | None:
        """The agent's next datagram; b"" when none came for half a second; None once
        the socket is closed."""
        try:
            return self._sock.recv(MAX_DATAGRAM)
        except TimeoutError:
            return b""
        except OSError:
            return None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
