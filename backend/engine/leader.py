"""Leadership: the decision engine runs on one replica at a time.

- SQLite is single-process: the one backend always leads.
- PostgreSQL: a session-level advisory lock (`pg_try_advisory_lock`) held on a dedicated
  connection, outside the pool. A non-leader retries every second. The lock lives as long
  as the connection, so a leader that dies (process killed, network cut, connection
  terminated) loses it without any cleanup, and another replica takes over within a
  retry interval. The leader checks its connection on every `ensure()`; when the check
  fails it is no longer leader (and stops deciding) until it wins the lock again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Protocol

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

log = logging.getLogger(__name__)

# pg_advisory_lock takes one bigint: "trainguard engine" folded into 63 bits, fixed so
# every replica and version agrees on it.
ENGINE_LOCK_KEY = 0x7472_6E67_6561_7264  # b"trngeard"


class Leadership(Protocol):
    @property
    def is_leader(self) -> bool: ...

    def ensure(self) -> bool:
        """Keep or try to take leadership; returns whether this replica leads now."""
        ...

    def release(self) -> None: ...


class SingleProcessLeadership:
    """SQLite: one process, always the leader."""

    kind = "single-process"

    @property
    def is_leader(self) -> bool:
        return True

    def ensure(self) -> bool:
        return True

    def release(self) -> None:
        return None


class AdvisoryLockLeadership:
    """PostgreSQL session-level advisory lock on a dedicated connection."""

    kind = "postgresql-advisory-lock"

    def __init__(
        self,
        url: str,
        key: int = ENGINE_LOCK_KEY,
        retry_s: float = 1.0,
        connect_timeout_s: int = 5,
    ) -> None:
        self.key = key
        self.retry_s = retry_s
        # Its own engine without a pool: the lock must stay on one connection that
        # nothing else uses, and disposing of it must really close that connection.
        self._engine: Engine = create_engine(
            url, poolclass=NullPool, connect_args={"connect_timeout": connect_timeout_s}
        )
        self._conn: Any = None
        self._leader = False
        self._next_try = 0.0
        self._lock = threading.Lock()
        self.acquired_at: float | None = None
        self.lost = 0  # times leadership was lost (connection gone)

    @property
    def is_leader(self) -> bool:
        return self._leader

    @property
    def connection(self) -> Any:
        """The dedicated connection (tests close it to simulate a dead leader)."""
        return self._conn

    def ensure(self) -> bool:
        with self._lock:
            if self._leader:
                if self._alive():
                    return True
                self._drop("lost the connection that holds the engine lock")
            now = time.monotonic()
            if now < self._next_try:
                return False
            self._next_try = now + self.retry_s
            try:
                if self._conn is None:
                    self._conn = self._engine.connect()
                got = bool(
                    self._conn.execute(
                        text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}
                    ).scalar()
                )
                self._conn.commit()  # end the implicit transaction; the lock is session-level
            except Exception as exc:
                log.warning("engine leadership: cannot try the lock: %s", exc)
                self._close()
                return False
            if got:
                self._leader = True
                self.acquired_at = time.time()
                log.info("engine leadership acquired (advisory lock %d)", self.key)
            return got

    def _alive(self) -> bool:
        try:
            self._conn.execute(text("SELECT 1"))
            self._conn.commit()
            return True
        except Exception:
            return False

    def _drop(self, why: str) -> None:
        log.warning("engine leadership lost: %s", why)
        self._leader = False
        self.acquired_at = None
        self.lost += 1
        self._close()
        # Let the standbys (who try every retry_s) take over before trying again.
        self._next_try = time.monotonic() + 2 * self.retry_s

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.invalidate()
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    def release(self) -> None:
        """Give the lock back (shutdown): another replica takes over at its next try."""
        with self._lock:
            if self._conn is not None and self._leader:
                with contextlib.suppress(Exception):
                    self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self.key})
                    self._conn.commit()
            self._leader = False
            self.acquired_at = None
            self._close()
            self._engine.dispose()


def leadership_for(url: str) -> SingleProcessLeadership | AdvisoryLockLeadership:
    if url.startswith("postgresql"):
        return AdvisoryLockLeadership(url)
    return SingleProcessLeadership()
