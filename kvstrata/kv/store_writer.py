"""StoreWriter: write-through of new full pages to L3, off the engine thread.

    engine thread: submit(pool, hashes, pages)  -> snapshot the pages (one copy), queue a job
    I/O thread:    batch_exists -> encode the pages the store lacks -> batch_put

The snapshot is what makes this safe: once `submit` returns, the pool pages may be evicted and
reused; the job only reads its own copy. Pages already written or read from the store in this
process are remembered (`known`, bounded), so they are neither copied nor sent twice. After any
store failure `known` starts over: a server that went down may have come back empty (a Redis
restart), and what it lost is written again when next used (`KVTiers.on_hit`, inserts). When more
than `max_pending_bytes` are queued (a slow or dead store), new pages are dropped and counted
(`kvstore_errors_total{kind="write_dropped"}`): the store misses them, memory stays bounded.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterable

import torch

from kvstrata.kv.page_codec import PageCodec
from kvstrata.kv.page_io import snapshot_pages
from kvstrata.kv.pool import PagePool
from kvstrata.kv.store.guard import GuardedStore

logger = logging.getLogger(__name__)


class StoreWriter:
    def __init__(
        self, store: GuardedStore, codec: PageCodec, max_pending_bytes: int = 512 * 2**20, known_capacity: int = 1 << 18
    ) -> None:
        self.store = store
        self.codec = codec
        self.max_pending_bytes = max_pending_bytes
        self.known_capacity = known_capacity
        self._known: OrderedDict[bytes, None] = OrderedDict()
        self._distrusted: set[bytes] = set()  # stored values found bad: overwrite, do not skip
        self._failures_seen = store.failures
        self._pending_bytes = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvstrata-kvstore-write")

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    def mark_known(self, hashes: Iterable[bytes]) -> None:
        """Pages the store is known to hold (for example, just read from it)."""
        with self._lock:
            for h in hashes:
                self._known[h] = None
                self._known.move_to_end(h)
            while len(self._known) > self.known_capacity:
                self._known.popitem(last=False)

    def distrust(self, h: bytes) -> None:
        """The store's value for page `h` is corrupt or foreign: the next write of that page, and
        the pages after it in the same write, overwrite instead of trusting `batch_exists`."""
        with self._lock:
            self._known.pop(h, None)
            self._distrusted.add(h)

    def is_known(self, h: bytes) -> bool:
        """Whether page `h` is known to be in the store (or queued for it)."""
        with self._lock:
            self._check_failures()
            return h in self._known

    def _check_failures(self) -> None:
        """Caller holds the lock: forget every known page if the store failed since last time."""
        failures = self.store.failures
        if failures != self._failures_seen:
            self._failures_seen = failures
            if self._known:
                logger.info("kvstore_known_reset pages=%d reason=store_failure", len(self._known))
                self._known.clear()

    def submit(self, pool: PagePool, hashes: list[bytes], pages: list[int], ttl_s: float | None = None) -> None:
        """Engine thread: queue the write of these full pages (chain order) unless already known;
        `ttl_s`: their lifetime in the store (retained prompts), None = the store's default."""
        with self._lock:
            self._check_failures()
            todo = [(h, p) for h, p in zip(hashes, pages) if h not in self._known]
            nbytes = len(todo) * self.codec.page_bytes
            if not todo:
                return
            overwrite = self._take_distrusted([h for h, _ in todo])
            dropped = self._pending_bytes + nbytes > self.max_pending_bytes
            if not dropped:
                self._pending_bytes += nbytes
        if dropped:
            self.store.stats.error(self.store.backend, "write_dropped", len(todo))
            return
        self.mark_known(h for h, _ in todo)
        snapshot = snapshot_pages(pool, [p for _, p in todo])  # [n, 2, layers, ps, kvh, hd], ours alone
        self._executor.submit(self._write, [h for h, _ in todo], snapshot, nbytes, overwrite, ttl_s)

    def submit_snapshot(self, hashes: list[bytes], snapshot: torch.Tensor, wait_s: float) -> Future[int] | None:
        """Queue the write of pages already copied out (`snapshot`: [n, ...] holding n whole pages,
        any dtype), waiting up to `wait_s` for room under `max_pending_bytes` rather than dropping
        (the shutdown flush). The future gives how many of the pages the store holds afterwards;
        None when no room came in time."""
        nbytes = len(hashes) * self.codec.page_bytes
        deadline = time.monotonic() + wait_s
        with self._idle:
            while self._pending_bytes and self._pending_bytes + nbytes > self.max_pending_bytes:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._idle.wait(left)
            overwrite = self._take_distrusted(hashes)
            self._pending_bytes += nbytes
        self.mark_known(hashes)
        return self._executor.submit(self._write, hashes, snapshot, nbytes, overwrite)

    def _take_distrusted(self, hashes: list[bytes]) -> bool:
        """Caller holds the lock: whether any of `hashes` must overwrite; they are trusted again."""
        overwrite = bool(self._distrusted) and any(h in self._distrusted for h in hashes)
        self._distrusted.difference_update(hashes)
        return overwrite

    def _write(
        self, hashes: list[bytes], snapshot: torch.Tensor, nbytes: int, overwrite: bool, ttl_s: float | None = None
    ) -> int:
        """I/O thread: returns how many of the pages the store holds now (0 when the write failed)."""
        try:
            keys = [h.hex() for h in hashes]
            have = 0 if overwrite else self.store.batch_exists(keys)
            if have < len(keys):
                data = snapshot.view(torch.uint8).view(len(keys), -1).numpy()  # [n, page_bytes]
                values = [self.codec.encode(h, data[i].data) for i, h in enumerate(hashes) if i >= have]
                if not self.store.batch_put(keys[have:], values, ttl_s):
                    self.forget(hashes[have:])  # not written: a later insert may try again
                    return have
                self.store.stats.wrote("store", len(values), sum(len(v) for v in values))
            return len(keys)
        except Exception:  # noqa: BLE001 - a bug here must not kill the I/O thread silently
            logger.exception("kvstore_write_failed pages=%d", len(hashes))
            self.forget(hashes)
            return 0
        finally:
            with self._idle:
                self._pending_bytes -= nbytes
                self._idle.notify_all()

    def forget(self, hashes: Iterable[bytes]) -> None:
        """Pages the store turned out not to hold: the next write of each is sent again."""
        with self._lock:
            for h in hashes:
                self._known.pop(h, None)

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued write is done, at most `timeout_s`; True if none is left."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._pending_bytes > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Drain within `timeout_s` (SIGTERM path), then stop the I/O thread."""
        if not self.drain(timeout_s):
            logger.warning("kvstore_writes_abandoned pending_bytes=%d timeout_s=%.1f", self._pending_bytes, timeout_s)
        self._executor.shutdown(wait=False, cancel_futures=True)
