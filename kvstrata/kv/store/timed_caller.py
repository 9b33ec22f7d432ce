"""TimedCaller: run a store call on a worker thread and wait for it at most `timeout_s`.

A backend call can hang where no socket timeout reaches it (a stopped server behind a proxy, a
hung NFS mount, a client library without timeouts). The caller (an I/O thread of the writer or
the prefetcher) then gives up on it: the call is abandoned, not killed, and its worker is replaced
by a fresh one for the next call; the stuck worker rejoins the idle ones whenever the backend
returns. At most `max_stuck` abandoned calls are kept: beyond that, `call` refuses at once, so a
store that never answers costs a bounded number of threads. Workers are daemon threads, so a call
that never returns never blocks the process from exiting.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Generic, TypeVar

from kvstrata.kv.store.base import StoreTimeoutError

T = TypeVar("T")


class _Call(Generic[T]):
    __slots__ = ("fn", "done", "value", "error", "abandoned")

    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None
        self.abandoned = False


class TimedCaller:
    def __init__(
        self, timeout_s: float, max_stuck: int = 4, name: str = "kvstrata-kvstore-call", max_idle: int = 4
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"a store call timeout must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        self.max_stuck = max_stuck
        self.max_idle = max_idle
        self.name = name
        self._stuck = 0
        self._idle: list[queue.SimpleQueue[_Call[Any]]] = []  # inboxes of the workers waiting for a call
        self._lock = threading.Lock()

    @property
    def num_stuck(self) -> int:
        """Abandoned calls whose backend has not returned yet."""
        return self._stuck

    @property
    def saturated(self) -> bool:
        """True while `max_stuck` calls hang: new calls are refused until one returns."""
        return self._stuck >= self.max_stuck

    def call(self, fn: Callable[[], T]) -> T:
        """fn()'s result or exception; StoreTimeoutError when it takes longer than `timeout_s`."""
        if self.saturated:
            raise StoreTimeoutError(f"{self._stuck} store calls are stuck; not starting another")
        job: _Call[T] = _Call(fn)
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._work, args=(inbox,), name=self.name, daemon=True).start()
        inbox.put(job)
        if not job.done.wait(self.timeout_s):
            with self._lock:
                if not job.done.is_set():  # it may have finished between the wait and the lock
                    job.abandoned = True
                    self._stuck += 1
            if job.abandoned:
                raise StoreTimeoutError(f"the store call took longer than {self.timeout_s:.1f} s; abandoned")
        if job.error is not None:
            raise job.error
        return job.value  # type: ignore[return-value]

    def _work(self, inbox: queue.SimpleQueue[_Call[Any]]) -> None:
        """Worker thread: run calls from `inbox` until there are enough idle workers."""
        while True:
            job = inbox.get()
            try:
                job.value = job.fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                job.error = exc
            with self._lock:
                job.done.set()
                if job.abandoned:
                    self._stuck -= 1
                if len(self._idle) >= self.max_idle:
                    return
                self._idle.append(inbox)
