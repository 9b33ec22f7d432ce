"""GuardedStore: a store that fails or hangs costs a miss within the call timeout, a counted error
and a backoff; hung calls are abandoned (a bounded number of them), and the store comes back."""
from __future__ import annotations

import threading

import pytest

from kvstrata.kv.store.base import StoreTimeoutError
from kvstrata.kv.store.guard import GuardedStore
from kvstrata.kv.store.timed_caller import TimedCaller
from kvstrata.kv.tier_stats import TierStats
from polling import wait_for


class GateStore:
    """An in-memory KVStore whose calls hang while `hanging` is set, until `release`; or raise.

    `calls` counts the calls that reached it, `hung` those blocked in it right now."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.hanging = False
        self.fail = False
        self.release = threading.Event()
        self.closed = False
        self.calls = 0
        self.hung = 0
        self._lock = threading.Lock()

    def _gate(self) -> None:
        with self._lock:
            self.calls += 1
        if self.fail:
            raise ConnectionError("store is down")
        if self.hanging:
            with self._lock:
                self.hung += 1
            self.release.wait()
            with self._lock:
                self.hung -= 1

    def batch_exists(self, keys: list[str]) -> int:
        self._gate()
        n = 0
        while n < len(keys) and keys[n] in self.data:
            n += 1
        return n

    def batch_get(self, keys: list[str]) -> list[bytes | None]:
        self._gate()
        return [self.data.get(k) for k in keys]

    def batch_put(self, keys: list[str], values: list[bytes]) -> None:
        self._gate()
        self.data.update(zip(keys, values))

    def close(self) -> None:
        self._gate()
        self.closed = True


def guarded(store: GateStore, **kw: float) -> GuardedStore:
    return GuardedStore(store, "gate", TierStats(), **kw)  # type: ignore[arg-type]


def test_a_hung_call_is_abandoned_counted_and_backed_off() -> None:
    store = GateStore()
    g = guarded(store, call_timeout_s=0.2, backoff_s=0.3)
    assert g.batch_put(["a", "b"], [b"1", b"2"]) and g.batch_exists(["a", "b", "c"]) == 2
    store.hanging = True
    assert g.batch_get(["a"]) == [None]  # the miss, not the value and not a hang ...
    assert wait_for(lambda: store.hung == 1)  # ... while the call it gave up on still hangs in the store
    assert g.stats.snapshot().errors == {("gate", "timeout"): 1} and g.failures == 1
    assert not g.available and g.caller.num_stuck == 1
    calls = store.calls
    assert g.batch_exists(["a"]) == 0 and store.calls == calls  # backing off: the call never reached the store
    store.release.set()  # the backend answers at last: the abandoned call ends quietly
    assert g.wait_available(2.0) and g.caller.num_stuck == 0
    store.hanging = False
    assert g.batch_get(["a", "b"]) == [b"1", b"2"]
    assert g.stats.snapshot().errors == {("gate", "timeout"): 1}


def test_at_most_max_stuck_calls_hang_then_the_store_is_unavailable() -> None:
    store = GateStore()
    store.hanging = True
    g = guarded(store, call_timeout_s=0.05, backoff_s=0.0, max_stuck=3)
    for _ in range(3):
        assert g.batch_exists(["a"]) == 0
    assert g.caller.num_stuck == 3 and g.caller.saturated and not g.available
    threads, calls = threading.active_count(), store.calls
    assert g.batch_get(["a"]) == [None] and store.calls == calls  # refused without reaching the store
    assert threading.active_count() == threads  # no new thread for a store that never answers
    assert not g.wait_available(0.1)
    store.release.set()
    assert g.wait_available(2.0) and g.caller.num_stuck == 0


def test_errors_keep_their_kind_and_close_is_bounded_even_while_backing_off() -> None:
    store = GateStore()
    store.fail = True
    g = guarded(store, call_timeout_s=0.2, backoff_s=60.0)
    assert not g.batch_put(["a"], [b"1"])
    assert g.stats.snapshot().errors == {("gate", "write"): 1} and not g.available
    store.fail = False
    g.close()  # closes the backend although it backs off
    assert store.closed
    store.closed, store.hanging = False, True
    g.close()  # a backend whose close hangs does not hold the caller: close returns ...
    assert wait_for(lambda: store.hung == 1) and not store.closed  # ... while the backend's close still hangs
    assert g.stats.snapshot().errors[("gate", "timeout")] == 1
    store.release.set()


def test_timed_caller_passes_results_and_exceptions_through() -> None:
    caller = TimedCaller(1.0)
    assert caller.call(lambda: 42) == 42
    with pytest.raises(ZeroDivisionError):
        caller.call(lambda: 1 // 0)
    gate = threading.Event()
    with pytest.raises(StoreTimeoutError):
        TimedCaller(0.05).call(gate.wait)
    gate.set()
    with pytest.raises(ValueError, match="positive"):
        TimedCaller(0.0)
