"""The radix cache's invariant checker (radix.py's module docstring lists the invariants), kept
apart from the cache's hot paths. Read-only; raises CacheIntegrityError."""
from __future__ import annotations

from typing import Any

from kvstrata.kv.hashing import TOKEN_BYTES, chain_hash, salt_bytes
from kvstrata.kv.pool import PagePool
from kvstrata.kv.radix_node import CacheIntegrityError, Node


def check_radix(
    top: Node, heap: list[tuple[Any, ...]], page_node: dict[int, Node], num_evictable: int, page_size: int,
    pool: PagePool,
) -> None:
    """`top`: the cache's top node; `heap`: its LRU heap entries (priority, seq, node, last_access);
    `page_node`: its page index; `num_evictable`: its count of unlocked pages."""

    def fail(msg: str) -> None:
        raise CacheIntegrityError(msg)

    heap_entries = {(id(n), stamp) for _, _, n, stamp in heap}
    seen: dict[int, Node] = {}
    evictable = 0
    for sub in top.children.values():
        salt = salt_bytes(sub.key)  # type: ignore[arg-type]
        stack = [sub]
        while stack:
            node = stack.pop()
            if node.lock_ref != node.pins + sum(c.lock_ref for c in node.children.values()):
                fail(f"lock_ref {node.lock_ref} != pins {node.pins} + children's at page {node.page}")
            for key, child in node.children.items():
                if child.parent is not node or child.key != key or child.page is None:
                    fail(f"child link broken at page {child.page}")
                if len(key) != page_size * TOKEN_BYTES:
                    fail(f"page {child.page} key holds {len(key)} bytes")
                if child.hash != chain_hash(node.hash, key, salt):  # type: ignore[arg-type]
                    fail(f"page {child.page} hash does not chain from its parent")
                if child.page in seen:
                    fail(f"page {child.page} cached twice")
                seen[child.page] = child
                if not pool.is_in_use(child.page):
                    fail(f"cached page {child.page} is not in use in the pool")
                if child.lock_ref == 0:
                    evictable += 1
                    if not child.children and (id(child), child.last_access) not in heap_entries:
                        fail(f"evictable leaf page {child.page} missing from the LRU heap")
                stack.append(child)
    if seen.keys() != page_node.keys() or any(seen[p] is not n for p, n in page_node.items()):
        fail("page index disagrees with the tree")
    if evictable != num_evictable:
        fail(f"evictable count {num_evictable} != {evictable} unlocked pages")
