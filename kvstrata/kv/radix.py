"""RadixPrefixCache: the L1 prefix cache, a tree of full KV pages keyed by their token ids.

    _top ──extra_key──▶ subtree root (no page, hash = namespace root) ──page tokens──▶ node ──▶ ...

One node per full page. A child's key is its page's token ids as bytes (`hashing.token_bytes`), so
a hit compares the tokens themselves and a hash collision can never return wrong KV. Each extra_key
(tenant `cache_salt`; None and "" are the same) has its own subtree, so tenants never share pages.
Each node keeps its chained page hash (`hashing.py`) for the hooks, L2/L3 and KV events.

Invariants (`check_integrity()`):
- every node below a subtree root holds one page, in use in the pool and owned by this cache alone.
- node.lock_ref == node.pins + sum(child.lock_ref), so an unlocked node has no locked descendant
  and every unlocked page can be evicted (leaves first).
- num_evictable_pages == number of page nodes with lock_ref == 0.
- every unlocked leaf has a heap entry at its last_access in radix_evictor.py's eviction order
  (eviction class, then recency); stale entries are skipped on pop.
- a node removed from the tree has parent None (only `_top` is attached with parent None).
"""
from __future__ import annotations

import hashlib
import logging
from typing import Sequence

from kvstrata.kv import eviction_policy as ep
from kvstrata.kv.hashing import TOKEN_BYTES, salt_bytes, token_bytes, tokens_from_bytes
from kvstrata.kv.pool import PagePool
from kvstrata.kv.radix_check import check_radix
from kvstrata.kv.radix_evictor import RadixEvictor
from kvstrata.kv.radix_node import (  # noqa: F401 - re-exported: callers import them from here
    CacheIntegrityError,
    Evicted,
    EvictHook,
    InsertHook,
    Match,
    Node,
    ResetHook,
)

logger = logging.getLogger(__name__)

class RadixPrefixCache:
    def __init__(self, pool: PagePool, page_size: int, root: bytes, policy: str = "lru") -> None:
        if page_size != pool.page_size:
            raise ValueError(f"prefix cache page_size {page_size} must equal the pool's {pool.page_size}")
        self.pool = pool
        self.page_size = page_size
        self.root = root
        self.policy = ep.check_policy(policy)
        self.on_insert: list[InsertHook] = []
        self.on_evict: list[EvictHook] = []
        self.on_reset: list[ResetHook] = []
        self._top = Node(None, None, root, None, 0)
        self._page_node: dict[int, Node] = {}
        self._num_evictable = 0
        self._clock = 0  # LRU time: bumped by lock() and insert(), never by match()
        self._evictor = RadixEvictor(self.policy, self._top, self._page_node)  # shares the page index
        self.evicting: list[tuple[int, float]] = []  # (class, retain_until) of the pages on_evict is given
        self.inserting: tuple[int, float] = (ep.PROBATION, 0.0)  # (class, retain_until) of on_insert's pages
        self.hits_by_class = [0, 0, 0]  # pages hit by admissions, by their class before the hit

    @property
    def num_cached_pages(self) -> int:
        return len(self._page_node)

    @property
    def num_evictable_pages(self) -> int:
        return self._num_evictable

    def class_counts(self) -> list[int]:
        """Cached pages per eviction class (probation, protected, retained). Read-only; safe from
        another thread (one atomic copy of the index, then reads)."""
        counts = [0, 0, 0]
        for node in list(self._page_node.values()):
            counts[node.cls] += 1
        return counts

    def cached_pages(self) -> set[int]:
        return set(self._page_node)

    def cached_entries(self) -> list[tuple[bytes, int]]:
        """(chain hash, page) of every cached page, each parent before its children. Read-only."""
        return [(node.hash, page) for page, node in self._page_node.items()]

    def match(self, tokens: Sequence[int], extra_key: str | None = None) -> Match:
        """Longest cached prefix of whole pages, at most (len(tokens) - 1) // page_size of them, so
        the last token is always recomputed. Read-only: changes nothing, not even LRU order. The
        result is valid until the next call that changes state; lock(match.node) to keep it."""
        sub = self._top.children.get(extra_key or "")
        n = (len(tokens) - 1) // self.page_size
        if sub is None or n <= 0:
            return Match([], 0, sub or self._top, [])
        step = self.page_size * TOKEN_BYTES
        data = token_bytes(tokens[: n * self.page_size])
        node, pages, hashes = sub, [], []
        for off in range(0, n * step, step):
            child = node.children.get(data[off : off + step])
            if child is None:
                break
            node = child
            pages.append(child.page)
            hashes.append(child.hash)
        return Match(pages, len(pages) * self.page_size, node, hashes)

    def lock(self, node: Node, hit: bool = False) -> None:
        """Changes state: pins `node` and its ancestors against eviction until unlock(node), and
        marks the path most recently used (and, for a request's cache `hit`, reused). Locks nest."""
        if node.parent is None and node is not self._top:
            raise ValueError("node is no longer in the cache (a stale Match?); match again")
        self._clock += 1
        node.pins += 1
        n: Node | None = node
        while n is not None:
            if n.lock_ref == 0 and n.page is not None:
                self._num_evictable -= 1
            n.lock_ref += 1
            n.last_access = self._clock
            if hit and n.page is not None:
                self.hits_by_class[n.cls] += 1
                n.cls = ep.hit_class(self.policy, n.cls)
            n = n.parent

    def unlock(self, node: Node) -> None:
        """Changes state: undoes one lock(node)."""
        if node.pins <= 0:
            raise ValueError("unlock() without a matching lock() on this node")
        node.pins -= 1
        n: Node | None = node
        while n is not None:
            n.lock_ref -= 1
            if n.lock_ref == 0 and n.page is not None:
                self._num_evictable += 1
                if not n.children:
                    self._evictor.push(n)
            n = n.parent

    def insert(
        self, tokens: Sequence[int], pages: list[int], extra_key: str | None = None, cls: int = ep.PROBATION,
        retain_until: float = 0.0,
    ) -> list[int]:
        """Changes state: caches the full pages of `tokens`; returns the caller's duplicate pages.
        Every page of the prefix is raised to eviction class `cls` (and `retain_until`) at least.

        Considers the first k = len(tokens) // page_size entries of `pages` (pages[i] holds
        tokens[i*ps:(i+1)*ps]); a partial last page and pages[k:] are ignored and stay the caller's.
        Ownership after the call, for each i < k:
        - the tree already had a page for that prefix with the SAME id: nothing changes hands
          (re-inserting a growing prefix during chunked prefill is safe);
        - the tree had a DIFFERENT page: pages[i] is returned; the caller must free it (and, to
          keep running, re-match and lock to use the tree's page instead);
        - the tree had none: pages[i] now belongs to the cache; the caller must never free it.
        New pages are unlocked (evictable) unless a locked node covers them: a running request
        locks `match(tokens[:k*ps + 1]).node` and then unlocks its old node.
        """
        ps = self.page_size
        k = len(tokens) // ps
        if len(pages) < k:
            raise ValueError(f"insert() got {len(pages)} pages for {k} full pages of tokens")
        if k == 0:
            return []
        if len(set(pages[:k])) != k:
            raise ValueError("insert() got the same page id twice")
        sub = self._top.children.get(extra_key or "")
        dups, _ = self._insert_below(sub, extra_key, tokens[: k * ps], pages[:k], cls, retain_until)
        return dups

    def extend(
        self, node: Node, tokens: Sequence[int], pages: list[int], extra_key: str | None = None, cls: int = ep.PROBATION,
        retain_until: float = 0.0,
    ) -> tuple[list[int], Match]:
        """Changes state: insert() for pages that continue the cached path ending at `node` (locked
        by the caller, e.g. a running request's cache node), without walking from the root: `tokens`
        are only the tokens after node's prefix, pages[i] holds tokens[i*ps:(i+1)*ps]. Same
        ownership rules as insert(); only the new pages are raised to `cls` (see raise_class for
        the path above `node`). Returns (the caller's duplicate pages, the Match of the new
        pages below `node`: the tree's pages for them, the deepest node, their hashes)."""
        if node.parent is None and node is not self._top:
            raise ValueError("node is no longer in the cache (a stale Match?); match again")
        if node.lock_ref == 0:
            raise ValueError("extend() below an unlocked node: lock it first")
        k = len(tokens) // self.page_size
        if len(pages) < k:
            raise ValueError(f"extend() got {len(pages)} pages for {k} full pages of tokens")
        if k == 0:
            return [], Match([], 0, node, [])
        if len(set(pages[:k])) != k:
            raise ValueError("extend() got the same page id twice")
        start = self._top.children.get(extra_key or "") if node is self._top else node
        dups, nodes = self._insert_below(start, extra_key, tokens[: k * self.page_size], pages[:k], cls, retain_until)
        last = nodes[-1] if nodes else node
        match = Match([n.page for n in nodes], len(nodes) * self.page_size, last, [n.hash for n in nodes])  # type: ignore[misc]
        return dups, match

    def raise_class(self, node: Node, cls: int, retain_until: float = 0.0) -> None:
        """Changes state: raises `node` and its ancestors to eviction class `cls` (and `retain_until`)
        at least; the caller holds a lock on `node`, so no heap entry changes."""
        n: Node | None = node
        while n is not None and n.page is not None:
            n.cls, n.retain_until = max(n.cls, cls), max(n.retain_until, retain_until)
            n = n.parent

    def _insert_below(
        self, start: Node | None, extra_key: str | None, tokens: Sequence[int], pages: list[int], cls: int,
        retain_until: float,
    ) -> tuple[list[int], list[Node]]:
        """Walk from `start` (the subtree root or a node in it; None = no subtree for extra_key yet)
        along the pages of `tokens` (len(pages) full pages), create the missing nodes; returns the
        caller's duplicate pages and the node of every page, walked or created."""
        k = len(pages)
        step = self.page_size * TOKEN_BYTES
        data = token_bytes(tokens)
        node = start if start is not None else self._top
        walked: list[Node] = []
        while start is not None and len(walked) < k:
            i = len(walked)
            child = node.children.get(data[i * step : (i + 1) * step])
            if child is None:
                break
            walked.append(child)
            node = child
        i = len(walked)
        dups = [p for p, n in zip(pages, walked) if p != n.page]
        owned = [p for p in dups + pages[i:k] if p in self._page_node]
        if owned:
            raise ValueError(f"pages {owned[:8]} are already cached at another prefix")
        # Validated: from here on nothing raises.
        self._clock += 1
        for n in walked:
            n.last_access = self._clock
            n.cls, n.retain_until = max(n.cls, cls), max(n.retain_until, retain_until)
        if i == k:
            if node.page is not None and node.lock_ref == 0 and not node.children:
                self._evictor.push(node)  # refreshed leaf: re-enter the LRU heap at its new time
            return dups, walked
        new_pages = pages[i:k]
        if start is None:
            node = Node(extra_key or "", None, self.root, self._top, self._clock)
            self._top.children[node.key] = node  # type: ignore[index]
        parent_hash = node.hash if node.page is not None else None
        salt, sha, page_node, now = salt_bytes(extra_key), hashlib.sha256, self._page_node, self._clock
        created: list[Node] = []
        for j in range(i, k):  # hot loop: chain_hash and attach inlined
            key = data[j * step : (j + 1) * step]
            child = Node(key, pages[j], sha(node.hash + key + salt).digest(), node, now)
            child.cls, child.retain_until = cls, retain_until
            node.children[key] = child
            page_node[pages[j]] = child
            created.append(child)
            node = child
        self._num_evictable += k - i
        self._evictor.push(node)
        if self.on_insert:
            self.inserting = (cls, retain_until)  # for on_insert hooks: the new pages' class
            hashes = [n.hash for n in created]
            token_lists = [tokens_from_bytes(n.key) for n in created]  # type: ignore[arg-type]
            for hook in self.on_insert:
                hook(hashes, new_pages, token_lists, parent_hash)
        return dups, walked + created

    def evict(self, num_pages: int) -> Evicted:
        """Changes state: removes up to `num_pages` unlocked pages, least recently used leaf first
        (a parent becomes a candidate once its last child goes). Calls on_evict while the cache
        still owns the pages, then frees them to the pool and returns them; fewer than asked when
        fewer are evictable. The engine is single-threaded, so nothing can reuse a freed page
        before the caller (and any tier copying victims in a hook) has seen it."""
        victims = self._evictor.evict(num_pages)
        self._num_evictable -= len(victims)
        logger.debug("prefix_cache_evict requested=%d freed=%d", num_pages, len(victims))
        return self._release(victims)

    def reset(self) -> list[int]:
        """Changes state (flush): removes every unlocked node; locked paths stay. Calls on_evict,
        frees the pages to the pool, calls on_reset and returns the freed pages."""
        victims = self._evictor.flush()
        self._num_evictable -= len(victims)
        logger.info("prefix_cache_reset freed=%d kept=%d", len(victims), len(self._page_node))
        freed = self._release(victims).pages
        for hook in self.on_reset:
            hook(len(self._page_node))
        return freed

    def check_integrity(self) -> None:
        """Check the invariants in the module docstring; raise CacheIntegrityError."""
        check_radix(self._top, self._evictor.heap, self._page_node, self._num_evictable, self.page_size, self.pool)

    # -- internals -------------------------------------------------------------------------------

    def _release(self, victims: list[Node]) -> Evicted:
        evicted = Evicted([n.page for n in victims], [n.hash for n in victims])  # type: ignore[misc]
        self.evicting = [(n.cls, n.retain_until) for n in victims]  # for on_evict hooks: each page's class
        if victims:
            for hook in self.on_evict:
                hook(evicted.hashes, evicted.pages)
            self.pool.free(evicted.pages)
        return evicted
