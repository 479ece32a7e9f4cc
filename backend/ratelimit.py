"""Token buckets per key (a principal's name), for operator actions.

A bucket holds up to `burst` tokens and refills at `per_s` tokens a second; an action
takes one. An operator can therefore do `burst` things at once (cordon a rack) and then
`per_s` a second for as long as they like, while a runaway script or a stolen token
cannot fire restarts faster than that. Buckets live in the process: with several
replicas behind a load balancer the limit applies per replica (docs/security.md).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Decision:
    allowed: bool
    retry_after_s: float  # 0 when allowed; otherwise when the next token is there
    refused_in_row: int  # refusals since the last allowed action (1 = the first one)

    @property
    def retry_after_header(self) -> str:
        """`Retry-After` in whole seconds, never 0 for a refusal."""
        return str(max(1, math.ceil(self.retry_after_s)))


@dataclass
class _Bucket:
    tokens: float
    at: float
    refused: int = 0


class RateLimiter:
    def __init__(
        self,
        burst: float,
        per_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 10_000,
    ) -> None:
        if burst < 1 or per_s <= 0:
            raise ValueError(f"a rate limit needs burst >= 1 and per_s > 0 (got {burst}, {per_s})")
        self.burst, self.per_s = float(burst), float(per_s)
        self.clock = clock
        self.max_keys = max_keys
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def acquire(self, key: str, cost: float = 1.0) -> Decision:
        """Take `cost` tokens from `key`'s bucket if it holds them."""
        now = self.clock()
        with self._lock:
            b = self._buckets.get(key)
            if b is None:
                if len(self._buckets) >= self.max_keys:
                    self._forget_full(now)
                b = self._buckets[key] = _Bucket(tokens=self.burst, at=now)
            b.tokens = min(self.burst, b.tokens + (now - b.at) * self.per_s)
            b.at = now
            if b.tokens >= cost:
                b.tokens -= cost
                b.refused = 0
                return Decision(True, 0.0, 0)
            b.refused += 1
            return Decision(False, (cost - b.tokens) / self.per_s, b.refused)

    def _forget_full(self, now: float) -> None:
        """Drop buckets that have refilled: a full bucket is the same as none."""
        full = [
            k
            for k, b in self._buckets.items()
            if b.tokens + (now - b.at) * self.per_s >= self.burst
        ]
        for k in full:
            del self._buckets[k]
        if len(self._buckets) >= self.max_keys:  # all busy: forget the oldest half
            for k in sorted(self._buckets, key=lambda k: self._buckets[k].at)[: self.max_keys // 2]:
                del self._buckets[k]
