"""TailPages: the part pages finished requests leave behind, kept for the next turn of their session.

The prefix cache holds full pages only, so a request that ends mid-page (its computed tokens are
N pages and r more) used to free those r tokens' page, and the session's next turn recomputed them:
up to page_size - 1 tokens a turn, each a row over the whole context. Here such a page is kept, keyed
by the chained hash of the full pages before it (`Node.hash`: the same prefix, tenant salt included),
with the r tokens it holds. A request whose match ends at that node and whose next tokens start with
some of those r takes the page (it becomes the request's own page: its later rows are written over),
so each tail serves one request. A page's K/V rows depend only on the tokens up to them, so rows that
agree on the tokens are the rows the request would compute.

Tails are the cheapest KV to lose (under a page of tokens each): the pool takes them back first, least
recently left first, and at most `capacity` are kept.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


class TailPages:
    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._tails: OrderedDict[bytes, tuple[tuple[int, ...], int]] = OrderedDict()  # hash -> (tokens, page)
        self.hits = 0  # tails taken
        self.tokens_hit = 0  # tokens they held that were not recomputed

    def __len__(self) -> int:
        return len(self._tails)

    def pages(self) -> list[int]:
        return [page for _, page in self._tails.values()]

    def put(self, key: bytes, tokens: Sequence[int], page: int) -> list[int]:
        """Keep `page` (holding `tokens` after the prefix `key`); returns the pages to free: one this key
        held before, and the oldest past capacity."""
        freed = []
        old = self._tails.pop(key, None)
        if old is not None:
            freed.append(old[1])
        self._tails[key] = (tuple(tokens), page)
        while len(self._tails) > self.capacity:
            freed.append(self._tails.popitem(last=False)[1][1])
        return freed

    def take(self, key: bytes, tokens: Sequence[int], limit: int) -> tuple[int, int] | None:
        """(page, n): the tail after `key` whose first n (1 <= n <= limit) tokens are the first of `tokens`,
        no longer kept here; None when there is none."""
        tail = self._tails.get(key)
        if tail is None or limit <= 0:
            return None
        held, page = tail
        n = 0
        for a, b in zip(held[:limit], tokens):
            if a != b:
                break
            n += 1
        if n == 0:
            return None
        del self._tails[key]
        self.hits += 1
        self.tokens_hit += n
        return page, n

    def evict(self, num_pages: int) -> list[int]:
        """Up to `num_pages` pages, the least recently kept first."""
        out = []
        while self._tails and len(out) < num_pages:
            out.append(self._tails.popitem(last=False)[1][1])
        return out

    def clear(self) -> list[int]:
        return self.evict(len(self._tails))
