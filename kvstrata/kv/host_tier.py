"""HostTier: L2, a host-memory LRU of KV pages keyed by their chain hash.

    data:  [capacity, 2, layers, page_size, kv_heads, head_dim]   (page-major, `page_io` layout)
    index: hash -> slot, least recently used first;   free: slots holding nothing

It catches what L1 evicts (copied while the radix cache still owns the page) and pages prefetched
from L3, and gives a hit back by copying into fresh L1 pages. Because keys are chain hashes, a hit
on page i means the whole prefix up to page i matches; `match` counts the leading run. Engine thread
only: nothing here locks.

Invariants (`check_integrity()`): every slot is in exactly one of index and free; pins only
name indexed hashes and exist only inside one KVCacheManager call.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Iterable

import numpy as np
import torch

from kvstrata.kv.page_io import read_pages, write_pages
from kvstrata.kv.pool import PagePool

logger = logging.getLogger(__name__)


class HostTierIntegrityError(AssertionError):
    pass


class HostTier:
    def __init__(self, capacity: int, page_shape: tuple[int, ...], dtype: torch.dtype, pin_memory: bool = False) -> None:
        if capacity <= 0:
            raise ValueError(f"host tier capacity must be positive, got {capacity} pages")
        self.capacity = capacity
        # committed now (zero_), like the L1 pool: the memory L2 is configured to hold is taken at
        # startup, where a shortage fails loudly, and RSS stays flat as L2 fills
        self.data = torch.empty((capacity, *page_shape), dtype=dtype, pin_memory=pin_memory).zero_()
        self.page_bytes = self.data[0].numel() * self.data.element_size()
        self._bytes = self.data.view(torch.uint8).view(capacity, self.page_bytes).numpy()  # [capacity, page_bytes]
        self._index: OrderedDict[bytes, int] = OrderedDict()
        self._free: list[int] = list(range(capacity - 1, -1, -1))
        self._pinned: set[bytes] = set()

    @property
    def num_pages(self) -> int:
        return len(self._index)

    def __contains__(self, h: bytes) -> bool:
        return h in self._index

    def match(self, hashes: list[bytes]) -> int:
        """How many of `hashes`, from the first, are held. Read-only."""
        n = 0
        for h in hashes:
            if h not in self._index:
                break
            n += 1
        return n

    def hashes(self) -> list[bytes]:
        """Every held page's hash, least recently used first. Read-only."""
        return list(self._index)

    def pin(self, hashes: Iterable[bytes]) -> None:
        """Changes state: keep these (held) pages through the next puts, until unpin()."""
        self._pinned.update(h for h in hashes if h in self._index)

    def unpin(self) -> None:
        self._pinned.clear()

    def put_from_pool(self, pool: PagePool, hashes: list[bytes], pages: list[int]) -> int:
        """Changes state: copy pool pages into L2 (held ones are only refreshed). Returns pages copied."""
        new_hashes, new_pages = [], []
        for h, p in zip(hashes, pages):
            if h in self._index:
                self._index.move_to_end(h)
            else:
                new_hashes.append(h)
                new_pages.append(p)
        slots = self._take_slots(new_hashes)
        read_pages(pool, new_pages[: len(slots)], self.data, slots)
        return len(slots)

    def put_bytes(self, h: bytes, payload: bytes | memoryview) -> bool:
        """Changes state: store one page from its bytes (an L3 payload); False if L2 is all pinned."""
        if h in self._index:
            self._index.move_to_end(h)
            return True
        slots = self._take_slots([h])
        if slots:
            self._bytes[slots[0]] = np.frombuffer(payload, dtype=np.uint8)
        return bool(slots)

    def load_into_pool(self, pool: PagePool, hashes: list[bytes], pages: list[int]) -> None:
        """Copy held pages `hashes` into pool pages `pages` (fresh, owned by the caller); marks them used."""
        slots = []
        for h in hashes:
            slots.append(self._index[h])
            self._index.move_to_end(h)
        write_pages(pool, pages, self.data, slots)

    def page_view(self, h: bytes) -> np.ndarray:
        """The bytes of a held page (a view: valid until the next call that changes state)."""
        return self._bytes[self._index[h]]

    def clear(self) -> int:
        """Changes state: forget every page; returns how many."""
        n = len(self._index)
        self._index.clear()
        self._pinned.clear()
        self._free = list(range(self.capacity - 1, -1, -1))
        return n

    def check_integrity(self) -> None:
        slots = list(self._index.values())
        if len(set(slots)) != len(slots):
            raise HostTierIntegrityError("a host slot is indexed twice")
        if set(slots) & set(self._free) or len(slots) + len(self._free) != self.capacity:
            raise HostTierIntegrityError(f"indexed {len(slots)} + free {len(self._free)} != {self.capacity}")
        if not self._pinned <= self._index.keys():
            raise HostTierIntegrityError("a pinned hash is not held")

    # -- internals -------------------------------------------------------------------------------

    def _take_slots(self, hashes: list[bytes]) -> list[int]:
        """Index `hashes` on free slots, evicting least recently used unpinned pages; stops when
        only pinned pages are left. Returns the slots, one per indexed hash, in order."""
        slots: list[int] = []
        for h in hashes:
            if not self._free and not self._evict_one():
                logger.debug("host_tier_full pinned=%d dropped=%d", len(self._pinned), len(hashes) - len(slots))
                break
            slot = self._free.pop()
            self._index[h] = slot
            slots.append(slot)
        return slots

    def _evict_one(self) -> bool:
        for h in self._index:
            if h not in self._pinned:
                self._free.append(self._index.pop(h))
                return True
        return False
