"""KVTiers: L2 (host memory) and L3 (a store) behind the L1 radix cache.

How a page moves (hashes are the page hash chain; the radix tree holds no tier fields):

    L1 insert ──on_insert──▶ StoreWriter: snapshot now, write to L3 later (I/O thread)
    L1 hit ──on_hit──▶ StoreWriter, for matched pages whose write failed (the store was down)
    L1 evict ──on_evict──▶ HostTier.put_from_pool (copied before the page is reused)
    shutdown: close ─▶ flush_to_store: L1 and L2 pages the store was never given ─▶ StoreWriter
    admission: L1 match ─▶ HostTier.match(the next hashes) ─▶ copy into fresh L1 pages, insert
    before admission: Prefetcher L3 ─▶ HostTier.put_bytes (engine thread), then the L2 path above

Ownership: a page lives in L1 (the radix cache or a request), and independently as a copy in L2
(by hash, LRU) and in L3 (by hash, shared). Copies never alias L1 memory, so each tier evicts on
its own. The KVCacheManager (engine) drives admission; this class knows pages and hashes only.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Sequence, TypeVar

from kvstrata.kv.eviction_policy import PROTECTED, RETAINED, now
from kvstrata.kv.hashing import hash_pages
from kvstrata.kv.host_tier import HostTier
from kvstrata.kv.prefetcher import Fetched, Prefetcher
from kvstrata.kv.radix import Match, RadixPrefixCache
from kvstrata.kv.store_flush import FlushReport, flush_to_store
from kvstrata.kv.store_writer import StoreWriter
from kvstrata.kv.tier_stats import TierStats

logger = logging.getLogger(__name__)
T = TypeVar("T")


class KVTiers:
    def __init__(
        self,
        cache: RadixPrefixCache,
        host: HostTier,
        stats: TierStats,
        writer: StoreWriter | None = None,
        prefetcher: Prefetcher | None = None,
    ) -> None:
        self.cache = cache
        self.pool = cache.pool
        self.page_size = cache.page_size
        self.host = host
        self.stats = stats
        self.writer = writer
        self.prefetcher = prefetcher
        self._from_store: dict[str, set[bytes]] = {}  # request key -> hashes its prefetch put in L2
        self._held: dict[str, list[bytes]] = {}  # request key -> those of them L2 holds for it
        self._catch_evictions = True
        cache.on_evict.append(self._on_evict)
        if writer is not None:
            cache.on_insert.append(self._on_insert)

    # -- hooks (engine thread) -------------------------------------------------------------------

    def _on_evict(self, hashes: list[bytes], pages: list[int]) -> None:
        if not self._catch_evictions:
            return
        n = self.host.put_from_pool(self.pool, hashes, pages, self.cache.evicting)
        self.stats.wrote("host", n, n * self.host.page_bytes)

    def _on_insert(self, hashes: list[bytes], pages: list[int], token_lists: list[list[int]], parent: bytes | None) -> None:
        assert self.writer is not None
        cls, until = self.cache.inserting
        ttl_s = until - now() if cls == RETAINED and until > now() else None  # retained: the store keeps it as long
        self.writer.submit(self.pool, hashes, pages, ttl_s)

    def on_hit(self, match: Match) -> None:
        """An L1 hit: write through the matched pages the store is not known to hold (their first
        write failed or was dropped while it was down), so a store that comes back gets the hot
        prefixes again. Nothing while the store is unavailable (no copies that would be dropped)."""
        if self.writer is not None and match.pages and self.writer.store.available:
            self.writer.submit(self.pool, match.hashes, match.pages)

    # -- admission (engine thread) ---------------------------------------------------------------

    def hashes_after(self, tokens: Sequence[int], extra_key: str | None, match: Match) -> list[bytes]:
        """Chain hashes of the matchable pages after the L1 hit (never the last token's page)."""
        end = (len(tokens) - 1) // self.page_size * self.page_size
        if end <= match.num_tokens:
            return []
        parent = match.hashes[-1] if match.hashes else None
        return hash_pages(tokens[match.num_tokens : end], self.page_size, self.cache.root, extra_key, parent)

    def load_host(self, hashes: list[bytes], pages: list[int]) -> None:
        """Copy L2 pages into fresh L1 pages."""
        self.host.load_into_pool(self.pool, hashes, pages)
        self.stats.read("host", len(pages), len(pages) * self.host.page_bytes)

    def prefetch_ready(self, key: str, tokens: Sequence[int], extra_key: str | None) -> bool:
        """False while this request should wait for L3: starts the prefetch on first call, puts
        the fetched pages into L2 once it finishes or its deadline passes."""
        pf = self.prefetcher
        if pf is None:
            return True
        if key not in pf:
            if not pf.store.available:
                return True
            hashes = self.hashes_after(tokens, extra_key, self.cache.match(tokens, extra_key))
            rest = hashes[self.host.match(hashes) :]
            if len(rest) < pf.policy.min_pages:
                return True
            pf.start(key, rest)
            return False
        fetched = pf.poll(key)
        if fetched is None:
            arrived = pf.take(key)
            if arrived.hashes:  # what has arrived goes to L2 now, and its memory is freed
                self._install(key, arrived)
            return False
        self._install(key, fetched)
        return True

    def _install(self, key: str, fetched: Fetched) -> None:
        """Put pages a prefetch brought into L2 and hold them for the request (called for each batch as
        it arrives, then for the job's result)."""
        # a prefix fetched for a waiting request is a reuse: protected, so that under slru the pages
        # other requests' L1 evictions bring into L2 (protected continuations) cannot push it out first
        stored = [h for h, p in zip(fetched.hashes, fetched.payloads) if self.host.put_bytes(h, p, (PROTECTED, 0.0))]
        self.stats.wrote("host", len(stored), len(stored) * self.host.page_bytes)
        if self.writer is not None:
            self.writer.mark_known(stored)
            self.writer.forget(fetched.missing)  # it may have lost them (expiry, eviction, restart)
            if fetched.bad is not None:
                self.writer.distrust(fetched.bad)  # heal the store when the page is computed again
        if stored:
            # held in L2 until the request is admitted or leaves: while it waits for L1 room, other
            # requests' L1 evictions must not push out the prefix it waited for
            self._held.setdefault(key, []).extend(self.host.hold(stored))
            self._from_store.setdefault(key, set()).update(stored)

    def take_prefetched(self, key: str) -> set[bytes]:
        """The hashes this request's prefetch brought into L2 (forgotten and released after this call)."""
        self.host.release(self._held.pop(key, ()))
        return self._from_store.pop(key, set())

    def forget(self, key: str) -> None:
        """The request left (admitted, aborted): drop its prefetch job and results."""
        self._from_store.pop(key, None)
        self.host.release(self._held.pop(key, ()))
        if self.prefetcher is not None:
            self.prefetcher.cancel(key)

    def wait_for_io(self, timeout_s: float) -> None:
        """Nothing to run: sleep until a prefetch finishes (or `timeout_s`) instead of spinning."""
        if self.prefetcher is not None and self.prefetcher.num_pending:
            self.prefetcher.wait(timeout_s)

    # -- maintenance -----------------------------------------------------------------------------

    def flush(self, reset_l1: Callable[[], T]) -> T:
        """Run `reset_l1` (the radix cache's reset) without catching its victims, then empty L2.
        L3 is shared and stays."""
        self._catch_evictions = False
        try:
            return reset_l1()
        finally:
            self._catch_evictions = True
            self.host.clear()
            self._held.clear()  # holds went with L2's pages

    def close(self, drain_timeout_s: float = 5.0, flush: bool = True) -> FlushReport | None:
        """Stop prefetching; write to L3 the L1 and L2 pages it is not known to hold (`flush`), and
        drain every queued write, all within `drain_timeout_s`; then close the store. Engine thread
        stopped: nothing may change L1 or L2 meanwhile."""
        if self.prefetcher is not None:
            self.prefetcher.close()
        if self.writer is None:
            return None
        deadline = time.monotonic() + drain_timeout_s
        report = flush_to_store(self.cache, self.host, self.writer, drain_timeout_s) if flush else None
        self.writer.close(max(0.0, deadline - time.monotonic()))
        self.writer.store.close()
        return report

    def check_integrity(self) -> None:
        self.host.check_integrity()
