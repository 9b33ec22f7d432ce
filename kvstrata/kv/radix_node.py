"""The radix tree's node and the small result types of RadixPrefixCache (see radix.py)."""
from __future__ import annotations

from typing import Callable, NamedTuple

# on_insert(hashes, pages, token_lists, parent_hash): newly cached pages, in chain order; parent_hash
# is the hash of the page they hang from, None when they start at the subtree root.
InsertHook = Callable[[list[bytes], list[int], list[list[int]], bytes | None], None]
# on_evict(hashes, pages): pages leaving the cache; called while the cache still owns them.
EvictHook = Callable[[list[bytes], list[int]], None]
# on_reset(kept): after reset() has evicted (on_evict) what it could; kept = locked pages left.
ResetHook = Callable[[int], None]


class CacheIntegrityError(AssertionError):
    pass


class Node:
    __slots__ = ("key", "page", "hash", "parent", "children", "lock_ref", "pins", "last_access", "cls", "retain_until")

    def __init__(self, key: bytes | str | None, page: int | None, hash: bytes, parent: Node | None, now: int) -> None:
        self.key = key  # page token bytes; the extra_key for a subtree root; None for _top
        self.page = page  # None for _top and subtree roots
        self.hash = hash
        self.parent = parent
        self.children: dict[bytes | str, Node] = {}
        self.lock_ref = 0  # pins on this node + lock_ref of its children
        self.pins = 0  # lock() calls on this very node
        self.last_access = now
        self.cls = 0  # eviction class (eviction_policy.py): probation, protected or retained
        self.retain_until = 0.0  # retained: wall-clock end of its retention


class Match(NamedTuple):
    pages: list[int]  # cached pages holding tokens[:num_tokens]
    num_tokens: int  # len(pages) * page_size
    node: Node  # deepest matched node; pass it to lock()/unlock()
    hashes: list[bytes]  # chain hashes of `pages`; continue with hash_pages(..., parent=hashes[-1])


class Evicted(NamedTuple):
    pages: list[int]  # already freed to the pool
    hashes: list[bytes]
