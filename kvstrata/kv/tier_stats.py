"""TierStats: counters of pages moving through L2 (host) and L3 (store), read at scrape time.

Incremented from the engine thread and the I/O threads, hence the lock. `metrics/tiers.py` turns
a `snapshot()` into `kvstrata:kvstore_{reads,writes,bytes}_total{tier}`,
`kvstrata:kvstore_prefetch_{started,completed,timeouts}_total` and
`kvstrata:kvstore_errors_total{backend,kind}`.
"""
from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TierSnapshot:
    reads: dict[str, int]  # tier -> pages read from it
    writes: dict[str, int]  # tier -> pages written to it
    bytes: dict[str, int]  # tier -> bytes read + written
    prefetch: dict[str, int]  # started / completed / timeouts
    errors: dict[tuple[str, str], int]  # (backend, kind) -> count


@dataclass
class TierStats:
    _reads: Counter[str] = field(default_factory=Counter)
    _writes: Counter[str] = field(default_factory=Counter)
    _bytes: Counter[str] = field(default_factory=Counter)
    _prefetch: Counter[str] = field(default_factory=Counter)
    _errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def read(self, tier: str, pages: int, nbytes: int) -> None:
        with self._lock:
            self._reads[tier] += pages
            self._bytes[tier] += nbytes

    def wrote(self, tier: str, pages: int, nbytes: int) -> None:
        with self._lock:
            self._writes[tier] += pages
            self._bytes[tier] += nbytes

    def prefetch(self, event: str) -> None:
        """event: "started" | "completed" | "timeouts"."""
        with self._lock:
            self._prefetch[event] += 1

    def error(self, backend: str, kind: str, n: int = 1) -> None:
        with self._lock:
            self._errors[(backend, kind)] += n

    def snapshot(self) -> TierSnapshot:
        with self._lock:
            return TierSnapshot(
                dict(self._reads), dict(self._writes), dict(self._bytes), dict(self._prefetch), dict(self._errors)
            )
