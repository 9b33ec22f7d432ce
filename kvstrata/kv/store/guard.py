"""GuardedStore: a KVStore that is down, slow or full costs hits, never a request.

Every call of the backend is caught: an exception becomes a miss (exists -> 0, get -> all None,
put -> False), one `kvstore_errors_total{backend,kind}` count, and at most one warning per minute.
After a failure the backend is left alone for `backoff_s` (calls answer the miss at once), so a
dead server does not cost every request a connect timeout.

A call that hangs (a stopped server, a mount that never answers) is abandoned after
`call_timeout_s` (`TimedCaller`): it counts as kind "timeout" and backs off like any failure, and
while `max_stuck` abandoned calls are still hanging the store stays unavailable. So no I/O thread
waits on a backend longer than `call_timeout_s`, and a shutdown never waits on a hung store.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, TypeVar

from kvstrata.kv.store.base import KVStore, StoreTimeoutError
from kvstrata.kv.store.timed_caller import TimedCaller
from kvstrata.kv.tier_stats import TierStats

logger = logging.getLogger(__name__)
T = TypeVar("T")


class GuardedStore:
    def __init__(
        self, store: KVStore, backend: str, stats: TierStats, backoff_s: float = 2.0, warn_every_s: float = 60.0,
        call_timeout_s: float = 10.0, max_stuck: int = 4,
    ) -> None:
        self.store = store
        self.caller = TimedCaller(call_timeout_s, max_stuck, name=f"kvstrata-kvstore-{backend}")
        self.backend = backend
        self.stats = stats
        self.backoff_s = backoff_s
        self.warn_every_s = warn_every_s
        self._down_until = 0.0
        self.failures = 0  # every failure so far: a store that failed may have lost what it held
        self._last_warning = -float("inf")
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        """False while backing off after a failure, or while too many abandoned calls hang."""
        return time.monotonic() >= self._down_until and not self.caller.saturated

    def wait_available(self, timeout_s: float) -> bool:
        """Sleep until `available` (True) or `timeout_s` passed (False); for the shutdown flush."""
        deadline = time.monotonic() + timeout_s
        while not self.available:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(0.05, left))
        return True

    def batch_exists(self, keys: list[str]) -> int:
        return self._call("exists", lambda: self.store.batch_exists(keys), 0) if keys else 0

    def batch_get(self, keys: list[str]) -> list[bytes | None]:
        miss: list[bytes | None] = [None] * len(keys)
        return self._call("read", lambda: self.store.batch_get(keys), miss) if keys else []

    def batch_put(self, keys: list[str], values: list[bytes], ttl_s: float | None = None) -> bool:
        if not keys:
            return True
        if ttl_s is None:
            return self._call("write", lambda: (self.store.batch_put(keys, values), True)[1], False)
        return self._call("write", lambda: (self.store.batch_put(keys, values, ttl_s=ttl_s), True)[1], False)

    def close(self) -> None:
        """Close the backend, even while backing off (bounded by the call timeout)."""
        self._call("close", self.store.close, None, always=True)

    def _call(self, kind: str, fn: Callable[[], T], miss: T, always: bool = False) -> T:
        if not (always or self.available):
            return miss
        try:
            return self.caller.call(fn)
        except StoreTimeoutError as exc:
            self.failed("timeout", exc)
            return miss
        except Exception as exc:  # noqa: BLE001 - any backend failure is a miss, by design
            self.failed(kind, exc)
            return miss

    def failed(self, kind: str, exc: BaseException | str) -> None:
        """Count one error of `kind`, back off, and warn if the last warning is a minute old."""
        self.stats.error(self.backend, kind)
        now = time.monotonic()
        with self._lock:
            self.failures += 1
            self._down_until = now + self.backoff_s
            warn = now - self._last_warning >= self.warn_every_s
            if warn:
                self._last_warning = now
        if warn:
            logger.warning(
                "kvstore_error backend=%s kind=%s error=%r backoff_s=%.1f (requests go on without L3; "
                "at most one warning per minute, see kvstrata:kvstore_errors_total)",
                self.backend, kind, exc, self.backoff_s,
            )
