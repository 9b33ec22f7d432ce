"""RadixEvictor: which unlocked pages leave the radix tree first (radix.py), and their removal.

The eviction order is a lazy min-heap over the tree's unlocked leaves, entries (priority, seq, node,
last_access): priority = eviction class (eviction_policy.py: probation < protected < retained) then
recency, seq a tie-break so entries never compare nodes. An entry goes stale when its node is removed,
grows a child, is locked or is touched after the push; stale entries are skipped on pop, and the heap
is rebuilt from the live leaves once stale ones outnumber them. The evictor takes nodes out of the
tree; the cache keeps the counts, calls its hooks and frees the pages.
"""
from __future__ import annotations

import heapq
import itertools

from kvstrata.kv import eviction_policy as ep
from kvstrata.kv.radix_node import Node


class RadixEvictor:
    def __init__(self, policy: str, top: Node, page_node: dict[int, Node]) -> None:
        self.policy = policy
        self.top = top  # the cache's top node: its children are the subtree roots
        self.page_node = page_node  # the cache's page index, shared: the evictor removes from it
        self.heap: list[tuple[int, int, Node, int]] = []  # lazy min-heap over unlocked leaves
        self._seq = itertools.count()  # heap tie-break, so entries never compare nodes

    def priority(self, node: Node) -> int:
        return ep.priority(self.policy, node.cls, node.retain_until, node.last_access, ep.now())

    def push(self, node: Node) -> None:
        """(Re-)enters an unlocked leaf into the heap at its current priority."""
        heapq.heappush(self.heap, (self.priority(node), next(self._seq), node, node.last_access))
        if len(self.heap) > 2 * len(self.page_node) + 64:  # drop stale entries, amortized O(1)
            nodes = [n for n in self.page_node.values() if not n.lock_ref and not n.children]
            self.heap = [(self.priority(n), next(self._seq), n, n.last_access) for n in nodes]
            heapq.heapify(self.heap)

    def evict(self, num_pages: int) -> list[Node]:
        """Removes up to `num_pages` unlocked page nodes from the tree, least recently used leaf first
        (a parent becomes a candidate once its last child goes), and returns them in that order."""
        victims: list[Node] = []
        lru = self.heap
        while len(victims) < num_pages and lru:
            _, _, node, stamp = heapq.heappop(lru)
            if node.parent is None or node.children or node.lock_ref or node.last_access != stamp:
                continue  # stale entry: removed, grew a child, locked, or touched since pushed
            while True:  # walk up the branch while its next node is the LRU leaf: no heap round trip
                parent: Node = node.parent  # type: ignore[assignment]
                self.detach(node)
                victims.append(node)
                if parent.children or parent.lock_ref:
                    break
                if parent.page is None:
                    self.detach(parent)  # an empty subtree root
                    break
                if len(victims) == num_pages or (lru and lru[0][0] < self.priority(parent)):
                    self.push(parent)
                    break
                node = parent
        return victims

    def flush(self) -> list[Node]:
        """Removes every unlocked node from the tree (locked paths stay) and empties the heap; returns
        the page nodes removed."""
        victims = [n for n in self.page_node.values() if not n.lock_ref]  # whole unlocked subtrees
        for node in victims:
            parent: Node = node.parent  # type: ignore[assignment]
            if parent.page is None or parent.lock_ref:  # the top of an unlocked subtree
                del parent.children[node.key]  # type: ignore[index]
        for node in victims:
            node.parent = None
            del self.page_node[node.page]  # type: ignore[index]
        for sub in list(self.top.children.values()):
            if not sub.lock_ref:  # then nothing below it was locked either
                self.detach(sub)
        self.heap = []  # no unlocked node is left
        return victims

    def detach(self, node: Node) -> None:
        del node.parent.children[node.key]  # type: ignore[union-attr,arg-type]
        node.parent = None
        if node.page is not None:
            del self.page_node[node.page]
