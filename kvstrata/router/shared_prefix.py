"""SharedPrefixes: which leading pages of a prompt are a prefix many sessions share (a fleet's system
prompt and tools), as the gateway has seen prompts go by.

Page hashes chain (page i's hash names the whole prefix up to it), so the prompts seen form a tree of
pages. A page that two different pages have followed is a branch point: the prefix up to it is shared
by at least two conversations. A session's own turns never branch it (each turn extends the one
before), so a prompt's shared prefix ends at its last page that has branched; the rest is the
session's own history. The cost policy prices the shared part as held on every rank: computing it once
more on an idle rank is a one-off that every later session there reuses, where queueing behind the one
rank that holds it is paid by every session (policy.CostAware).

Bounded: the `capacity` most recently seen pages (LRU); one that is forgotten has simply not branched.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence, Union

BRANCHED = "branched"  # a page seen followed by two different pages
END = "end"  # a page seen only as a prompt's last (its successor not yet known)
Next = Union[int, str]


class SharedPrefixes:
    def __init__(self, capacity: int = 1 << 20) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._next: OrderedDict[int, Next] = OrderedDict()  # page hash -> the page after it, BRANCHED or END

    def __len__(self) -> int:
        return len(self._next)

    def shared_pages(self, hashes: Sequence[int]) -> int:
        """Leading pages of a prompt (its page hashes) that end at a branch point seen before."""
        shared = 0
        for i, h in enumerate(hashes):
            nxt = self._next.get(h)
            if nxt is None:
                break
            if nxt == BRANCHED:
                shared = i + 1
        return shared

    def observe(self, hashes: Sequence[int]) -> None:
        """Record a prompt's pages: each page's successor, or that it branched."""
        for i, h in enumerate(hashes):
            nxt: Next = hashes[i + 1] if i + 1 < len(hashes) else END
            seen = self._next.get(h)
            if seen is None or seen == END:
                self._next[h] = nxt
            elif nxt != END and seen not in (nxt, BRANCHED):
                self._next[h] = BRANCHED
            self._next.move_to_end(h)
        while len(self._next) > self.capacity:
            self._next.popitem(last=False)
