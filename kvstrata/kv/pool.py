"""PagePool: the L1 KV tensors and their free list.

Layout (one pair of tensors per layer):
    k[layer], v[layer]: [num_pages * page_size, kv_heads, head_dim]
A token's slot is `page * page_size + offset`; a request owns a list of pages (its page table).

Invariant: every page id in [0, num_pages) is either in the free list or handed out (in use),
never both, so `num_free + num_in_use == num_pages`. Who holds an in-use page (a running request
or the prefix cache) is the caller's bookkeeping; `check_integrity()` checks the pool's own part.
"""
from __future__ import annotations

from collections import deque

import torch


class PoolIntegrityError(AssertionError):
    pass


class PagePool:
    def __init__(
        self,
        num_pages: int,
        page_size: int,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_pages <= 0 or page_size <= 0:
            raise ValueError(f"num_pages and page_size must be positive, got {num_pages}, {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self.layers = layers
        shape = (num_pages * page_size, kv_heads, head_dim)
        # [num_slots, kv_heads, head_dim] per layer. Written (zero_), not just allocated: a large CPU
        # allocation is untouched zero pages the OS commits on first write, so RSS would creep up as
        # the pool first fills (a leak to a soak test) and an out-of-memory would wait for the first
        # busy hour instead of failing at startup.
        self.k: list[torch.Tensor] = [torch.empty(shape, dtype=dtype, device=device).zero_() for _ in range(layers)]
        self.v: list[torch.Tensor] = [torch.empty(shape, dtype=dtype, device=device).zero_() for _ in range(layers)]
        self._free: deque[int] = deque(range(num_pages))
        self._in_use: set[int] = set()

    @staticmethod
    def bytes_per_page(page_size: int, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * layers * page_size * kv_heads * head_dim * elem

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_in_use(self) -> int:
        return len(self._in_use)

    def is_in_use(self, page: int) -> bool:
        return page in self._in_use

    def alloc(self, n: int) -> list[int] | None:
        """Take n pages, or None (taking nothing) if fewer than n are free."""
        if n > len(self._free):
            return None
        pages = [self._free.popleft() for _ in range(n)]
        self._in_use.update(pages)
        return pages

    def free(self, pages: list[int]) -> None:
        for p in pages:
            if p not in self._in_use:
                raise PoolIntegrityError(f"page {p} freed but not in use (double free?)")
            self._in_use.remove(p)
            self._free.append(p)

    def check_integrity(self, held: dict[str, list[int]] | None = None) -> None:
        """Check the free list; with `held` (owner -> pages), also that every in-use page has
        exactly one owner and every owned page is in use."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise PoolIntegrityError("a page is in the free list twice")
        if free & self._in_use:
            raise PoolIntegrityError(f"pages both free and in use: {sorted(free & self._in_use)[:8]}")
        if len(free) + len(self._in_use) != self.num_pages:
            raise PoolIntegrityError(
                f"free {len(free)} + in use {len(self._in_use)} != total {self.num_pages}"
            )
        if held is None:
            return
        owner_of: dict[int, str] = {}
        for owner, pages in held.items():
            for p in pages:
                if p in owner_of:
                    raise PoolIntegrityError(f"page {p} held by both {owner_of[p]} and {owner}")
                owner_of[p] = owner
        if set(owner_of) != self._in_use:
            leaked = sorted(self._in_use - set(owner_of))[:8]
            unowned = sorted(set(owner_of) - self._in_use)[:8]
            raise PoolIntegrityError(f"in-use pages without owner {leaked}; owned pages not in use {unowned}")
