"""KVCacheManager: how pages move between the pool, running requests and the prefix cache.

    request.pages = [ shared: owned by the prefix cache, locked | own: this request's ]
                      0 .. num_shared_pages                      .. len(pages)

- ready:    False while the request's prefix is being prefetched from L3 into L2 (it waits; others go).
- admit:    match the prompt in L1, lock the match, continue the hash chain in L2 (copy those pages
            into fresh L1 pages and cache them), start computing after the hit.
- allocate: grow the page table to cover the next n tokens, evicting unlocked cache leaves.
- trim:     after a verify step, give back the pages only rejected drafts used.
- commit:   after a step, hand newly filled own pages to the cache (duplicates of pages the cache
            already has are swapped for the cache's page and freed), so other requests share them
            while this one is still running.
- release:  on finish, abort or preemption: commit, unlock, free the own pages; a part page of
            computed tokens past the last full one is kept as a tail (kv/tail_pages.py) that the
            session's next request takes at admit instead of recomputing those tokens.
"""
from __future__ import annotations

from typing import NamedTuple

from kvstrata.engine.request import Request
from kvstrata.kv.eviction_policy import PROBATION, RETAINED, RETENTION_S, insert_class, now
from kvstrata.kv.pool import PagePool
from kvstrata.kv.radix import Match, RadixPrefixCache
from kvstrata.kv.tail_pages import TailPages
from kvstrata.kv.tiers import KVTiers

TAIL_SHARE = 32  # at most a 32nd of the pool's pages is held as tails


class CacheHit(NamedTuple):
    """Prompt tokens whose KV came from each tier at admission."""

    device: int = 0  # L1
    host: int = 0  # L2 (copied into fresh L1 pages)
    store: int = 0  # L3, prefetched into L2 for this request

    @property
    def tokens(self) -> int:
        return self.device + self.host + self.store

    def by_tier(self) -> dict[str, int]:
        return {"device": self.device, "host": self.host, "store": self.store}


class KVCacheManager:
    def __init__(self, pool: PagePool, cache: RadixPrefixCache | None, tiers: KVTiers | None = None,
                 tails: bool = True) -> None:
        self.pool = pool
        self.cache = cache
        self.tiers = tiers
        self.page_size = pool.page_size
        self.tails = TailPages(pool.num_pages // TAIL_SHARE) if cache is not None and tails else None

    @property
    def evictable_pages(self) -> int:
        """Pages the pool can take back when it runs short: unlocked cache pages and tails."""
        if self.cache is None:
            return 0
        return self.cache.num_evictable_pages + len(self.tails or ())

    @property
    def kept_pages(self) -> int:
        """Pages kept for reuse that no request holds: the prefix cache's and the tails."""
        if self.cache is None:
            return 0
        return self.cache.num_cached_pages + len(self.tails or ())

    def _make_room(self, need: int) -> None:
        """Free pages until `need` are free (or nothing more can go): tails first, then cache leaves."""
        if need > self.pool.num_free and self.tails:
            self.pool.free(self.tails.evict(need - self.pool.num_free))
        if need > self.pool.num_free and self.cache is not None:
            self.cache.evict(need - self.pool.num_free)

    # -- admission -------------------------------------------------------------------------
    def ready(self, req: Request) -> bool:
        """Whether `req` may be admitted now; False while its prefix is prefetched from L3."""
        if self.tiers is None or req.params.prompt_logprobs is not None:  # the latter matches nothing (admit)
            return True
        return self.tiers.prefetch_ready(req.request_id, req.token_ids, req.params.extra_key)

    def cached_tokens(self, req: Request) -> int:
        """Prompt tokens a waiting request would find in L1 now (read-only, nothing locked): the scheduler's
        estimate of the work it saves. L2/L3 hits are not counted: such a prompt is estimated as more work than it is."""
        if self.cache is None or req.params.prompt_logprobs is not None:
            return 0
        return self.cache.match(req.token_ids, req.params.extra_key).num_tokens

    def admit(self, req: Request) -> CacheHit:
        """Match the request's tokens in L1 then L2 and lock the hit (L2 pages are copied into
        fresh L1 pages and cached there first)."""
        assert not req.pages and req.num_computed_tokens == 0
        if self.cache is None:
            return CacheHit()
        # prompt logprobs need every prompt row's logits: such a request matches nothing and computes its
        # whole prompt (its pages still go to the cache for the requests after it)
        fresh = req.params.prompt_logprobs is not None
        m = self.cache.match([] if fresh else req.token_ids, req.params.extra_key)
        self.cache.lock(m.node, hit=not req.admitted_once)  # a preempted request's own pages are no reuse
        device, host, store = m.num_tokens, 0, 0
        if self.tiers is not None and fresh:
            self.tiers.take_prefetched(req.request_id)
            self.tiers.forget(req.request_id)
        elif self.tiers is not None:
            self.tiers.on_hit(m)
            m, loaded = self._load_from_host(req, m)
            from_store = self.tiers.take_prefetched(req.request_id)
            self.tiers.forget(req.request_id)
            store = sum(h in from_store for h in loaded) * self.page_size
            host = len(loaded) * self.page_size - store
        req.cache_node = m.node
        req.pages = list(m.pages)
        req.num_shared_pages = len(m.pages)
        req.num_computed_tokens = m.num_tokens
        if self.tails is not None and m.pages and not fresh:  # the last token is always computed (as match's)
            tail = self.tails.take(m.node.hash, req.token_ids[m.num_tokens :], req.num_tokens - 1 - m.num_tokens)
            if tail is not None:
                req.pages.append(tail[0])
                req.num_computed_tokens += tail[1]
                device += tail[1]
        return CacheHit(device, host, store)

    def _load_from_host(self, req: Request, m: Match) -> tuple[Match, list[bytes]]:
        """Continue the locked L1 match `m` with L2 pages; returns the locked match and the hashes
        of the pages copied in."""
        assert self.cache is not None and self.tiers is not None
        host = self.tiers.host
        hashes = self.tiers.hashes_after(req.token_ids, req.params.extra_key, m)
        hashes = hashes[: host.match(hashes)]
        if not hashes:
            return m, []
        host.pin(hashes)  # L1 victims evicted below go to L2: they must not push these out
        try:
            self._make_room(len(hashes))  # m is locked: never its pages
            hashes = hashes[: self.pool.num_free]
            pages = self.pool.alloc(len(hashes)) or []
            self.tiers.load_host(hashes, pages)
        finally:
            host.unpin()
        if not pages:
            return m, []
        tokens = req.token_ids[: (len(m.pages) + len(pages)) * self.page_size]
        duplicates = self.cache.insert(tokens, m.pages + pages, req.params.extra_key)
        assert not duplicates, "L2 continued an L1 match that was not the longest"
        full = self.cache.match(tokens + [0], req.params.extra_key)
        self.cache.lock(full.node, hit=not req.admitted_once)
        self.cache.unlock(m.node)
        return full, hashes

    # -- allocation ------------------------------------------------------------------------
    def pages_needed(self, req: Request, num_new_tokens: int) -> int:
        total = req.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.page_size) - len(req.pages))

    def can_allocate(self, req: Request, num_new_tokens: int) -> bool:
        return self.pages_needed(req, num_new_tokens) <= self.pool.num_free + self.evictable_pages

    def allocate(self, req: Request, num_new_tokens: int) -> None:
        need = self.pages_needed(req, num_new_tokens)
        self._make_room(need)
        pages = self.pool.alloc(need)
        if pages is None:
            raise RuntimeError(f"allocate({need}) without can_allocate: {self.pool.num_free} free")
        req.pages.extend(pages)

    def trim(self, req: Request) -> None:
        """Free the request's own pages past its tokens: a verify step allocated slots for its whole
        draft, and the rejected drafts' slots go back (their K/V is never read: it is past the
        computed tokens, and the next step writes over what it reuses)."""
        keep = max(req.num_shared_pages, -(-req.num_tokens // self.page_size))
        if len(req.pages) > keep:
            self.pool.free(req.pages[keep:])
            del req.pages[keep:]

    # -- handing pages to the cache --------------------------------------------------------
    def commit(self, req: Request) -> None:
        """Insert the request's full, computed pages into the prefix cache: only the pages filled
        since the last commit, continuing below the request's locked cache node (O(new pages), not
        a walk of the whole prefix from the root)."""
        if self.cache is None:
            return
        ps, shared = self.page_size, req.num_shared_pages
        full = req.num_computed_tokens // ps
        if full <= shared:
            return
        assert req.cache_node is not None, "commit() before admit()"
        p, cached, prompt = req.params, req.stats.cached_tokens, req.num_prompt_tokens
        cls = insert_class(self.cache.policy, p.retention, cached, prompt)
        until = now() + RETENTION_S.get(p.retention, 0.0) if cls == RETAINED else 0.0
        # a cache_control breakpoint retains the pages before it only; those after get the class of no retention
        edge = p.retain_tokens // ps if cls == RETAINED and p.retain_tokens else full
        if cls != PROBATION:  # the prefix this request matched is kept at its class too (up to the edge)
            node = req.cache_node
            for _ in range(shared - min(edge, shared)):
                node = node.parent  # type: ignore[assignment]
            self.cache.raise_class(node, cls, until)  # type: ignore[arg-type]
        if shared < edge:
            self._extend(req, min(edge, full), cls, until)
        if req.num_shared_pages < full:
            self._extend(req, full, insert_class(self.cache.policy, "in_memory", cached, prompt), 0.0)

    def _extend(self, req: Request, end: int, cls: int, until: float) -> None:
        """Cache the request's own pages up to page `end` at class `cls`, below its locked cache node."""
        ps, shared = self.page_size, req.num_shared_pages
        tokens = req.token_ids[shared * ps : end * ps]
        assert req.cache_node is not None
        duplicates, m = self.cache.extend(req.cache_node, tokens, req.pages[shared:end], req.params.extra_key, cls,
                                          until)
        assert len(m.pages) == end - shared, (len(m.pages), end - shared)
        for i, page in enumerate(m.pages, start=shared):
            if req.pages[i] != page:
                assert req.pages[i] in duplicates
                req.pages[i] = page
        self.cache.lock(m.node)
        self.cache.unlock(req.cache_node)
        req.cache_node = m.node
        req.num_shared_pages = end
        if duplicates:
            self.pool.free(sorted(duplicates))

    def release(self, req: Request) -> None:
        """Give back everything the request holds; its computed full pages stay cached."""
        self.commit(req)
        own = req.pages[req.num_shared_pages :]
        ps, done = self.page_size, req.num_computed_tokens
        if self.tails is not None and req.cache_node is not None and own and done % ps and req.num_shared_pages == done // ps:
            # commit cached every full computed page, so own[0] holds the computed tokens past them
            self.pool.free(self.tails.put(req.cache_node.hash, req.token_ids[done - done % ps : done], own[0]))
            own = own[1:]
        if self.cache is not None and req.cache_node is not None:
            self.cache.unlock(req.cache_node)
        if own:
            self.pool.free(own)
        req.pages = []
        req.num_shared_pages = 0
        req.cache_node = None
        req.num_computed_tokens = 0
        if self.tiers is not None:
            self.tiers.forget(req.request_id)

    def wait_for_io(self, timeout_s: float) -> None:
        """Nothing to run this step: wait for a prefetch (bounded) instead of spinning."""
        if self.tiers is not None:
            self.tiers.wait_for_io(timeout_s)

    def reset_cache(self) -> int:
        """Drop every cached page no running request uses, and all of L2 (L3 is shared and
        stays); returns how many L1 pages were freed."""
        if self.cache is None:
            return 0
        tails = self.tails.clear() if self.tails is not None else []
        self.pool.free(tails)
        if self.tiers is not None:
            return len(tails) + len(self.tiers.flush(self.cache.reset))
        return len(tails) + len(self.cache.reset())

    def check_integrity(self, running: list[Request]) -> None:
        held: dict[str, list[int]] = {r.request_id: r.pages[r.num_shared_pages :] for r in running}
        if self.tiers is not None:
            self.tiers.check_integrity()
        if self.cache is not None:
            self.cache.check_integrity()
            held["prefix-cache"] = sorted(self.cache.cached_pages())
            held["tails"] = sorted(self.tails.pages()) if self.tails is not None else []
            for r in running:
                shared = r.pages[: r.num_shared_pages]
                missing = set(shared) - set(held["prefix-cache"])
                assert not missing, f"{r.request_id} shares pages the cache does not hold: {missing}"
        self.pool.check_integrity(held)
