"""KVCacheManager: how pages move between the pool, running requests and the prefix cache.

    request.pages = [ shared: owned by the prefix cache, locked | own: this request's ]
                      0 .. num_shared_pages                      .. len(pages)

- admit:    match the prompt in the cache, lock the match, start computing after it.
- allocate: grow the page table to cover the next n tokens, evicting unlocked cache leaves.
- commit:   after a step, hand newly filled own pages to the cache (duplicates of pages the cache
            already has are swapped for the cache's page and freed), so other requests share them
            while this one is still running.
- release:  on finish, abort or preemption: commit, unlock, free the own pages.
"""
from __future__ import annotations

from kvstrata.engine.request import Request
from kvstrata.kv.pool import PagePool
from kvstrata.kv.radix import RadixPrefixCache


class KVCacheManager:
    def __init__(self, pool: PagePool, cache: RadixPrefixCache | None) -> None:
        self.pool = pool
        self.cache = cache
        self.page_size = pool.page_size

    # -- admission -------------------------------------------------------------------------
    def admit(self, req: Request) -> int:
        """Match the request's tokens in the prefix cache and lock the hit. Returns hit tokens."""
        assert not req.pages and req.num_computed_tokens == 0
        if self.cache is None:
            return 0
        m = self.cache.match(req.token_ids, req.params.extra_key)
        self.cache.lock(m.node)
        req.cache_node = m.node
        req.pages = list(m.pages)
        req.num_shared_pages = len(m.pages)
        req.num_computed_tokens = m.num_tokens
        return m.num_tokens

    # -- allocation ------------------------------------------------------------------------
    def pages_needed(self, req: Request, num_new_tokens: int) -> int:
        total = req.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.page_size) - len(req.pages))

    def can_allocate(self, req: Request, num_new_tokens: int) -> bool:
        evictable = self.cache.num_evictable_pages if self.cache is not None else 0
        return self.pages_needed(req, num_new_tokens) <= self.pool.num_free + evictable

    def allocate(self, req: Request, num_new_tokens: int) -> None:
        need = self.pages_needed(req, num_new_tokens)
        if need > self.pool.num_free and self.cache is not None:
            self.cache.evict(need - self.pool.num_free)
        pages = self.pool.alloc(need)
        if pages is None:
            raise RuntimeError(f"allocate({need}) without can_allocate: {self.pool.num_free} free")
        req.pages.extend(pages)

    # -- handing pages to the cache --------------------------------------------------------
    def commit(self, req: Request) -> None:
        """Insert the request's full, computed pages into the prefix cache."""
        if self.cache is None:
            return
        full = req.num_computed_tokens // self.page_size
        if full <= req.num_shared_pages:
            return
        tokens = req.token_ids[: full * self.page_size]
        duplicates = set(self.cache.insert(tokens, req.pages[:full], req.params.extra_key))
        # match never returns the last token's page, so one extra (never compared) token makes
        # it return exactly `full` pages.
        m = self.cache.match(tokens + [0], req.params.extra_key)
        assert len(m.pages) == full, (len(m.pages), full)
        for i in range(req.num_shared_pages, full):
            if req.pages[i] != m.pages[i]:
                assert req.pages[i] in duplicates
                req.pages[i] = m.pages[i]
        self.cache.lock(m.node)
        self.cache.unlock(req.cache_node)
        req.cache_node = m.node
        req.num_shared_pages = full
        if duplicates:
            self.pool.free(sorted(duplicates))

    def release(self, req: Request) -> None:
        """Give back everything the request holds; its computed full pages stay cached."""
        self.commit(req)
        own = req.pages[req.num_shared_pages :]
        if self.cache is not None and req.cache_node is not None:
            self.cache.unlock(req.cache_node)
        if own:
            self.pool.free(own)
        req.pages = []
        req.num_shared_pages = 0
        req.cache_node = None
        req.num_computed_tokens = 0

    def reset_cache(self) -> int:
        """Drop every cached page no running request uses; returns how many were freed."""
        return len(self.cache.reset()) if self.cache is not None else 0

    def check_integrity(self, running: list[Request]) -> None:
        held: dict[str, list[int]] = {r.request_id: r.pages[r.num_shared_pages :] for r in running}
        if self.cache is not None:
            self.cache.check_integrity()
            held["prefix-cache"] = sorted(self.cache.cached_pages())
            for r in running:
                shared = r.pages[: r.num_shared_pages]
                missing = set(shared) - set(held["prefix-cache"])
                assert not missing, f"{r.request_id} shares pages the cache does not hold: {missing}"
        self.pool.check_integrity(held)
