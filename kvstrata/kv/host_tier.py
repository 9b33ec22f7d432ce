"""HostTier: L2, a host-memory cache of KV pages keyed by their chain hash, segmented by class.

    data:  [capacity, 2, layers, page_size, kv_heads, head_dim]   (page-major, `page_io` layout)
    index: hash -> slot;   free: slots holding nothing
    segments: one LRU per eviction class (eviction_policy.py), least recently used first:
              probation (evicted first), protected, retained (kept from other traffic, within quota)

A page keeps the class L1 gave it. `retention_quota` (a share of capacity) bounds the retained
segment: a retained page beyond it demotes the oldest retained page to protected; one whose
retention expired is demoted when it would be a victim's neighbour. Under policy `lru` protected is
probation (one recency order), so only retained pages are set apart.

It catches what L1 evicts (copied while the radix cache still owns the page) and pages prefetched
from L3, and gives a hit back by copying into fresh L1 pages. Because keys are chain hashes, a hit
on page i means the whole prefix up to page i matches; `match` counts the leading run. Engine thread
only: nothing here locks.

Invariants (`check_integrity()`): every slot is in exactly one of index and free; pins only
name indexed hashes and exist only inside one KVCacheManager call; holds (pages an L3 prefetch
brought for a request still waiting for admission) name indexed hashes, at most half of L2.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Iterable

import numpy as np
import torch

from kvstrata.kv import eviction_policy as ep
from kvstrata.kv.page_io import read_pages, write_pages
from kvstrata.kv.pool import PagePool

logger = logging.getLogger(__name__)


class HostTierIntegrityError(AssertionError):
    pass


class HostTier:
    def __init__(
        self, capacity: int, page_shape: tuple[int, ...], dtype: torch.dtype, pin_memory: bool = False,
        policy: str = "lru", retention_quota: float = 0.0,
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"host tier capacity must be positive, got {capacity} pages")
        self.capacity = capacity
        # committed now (zero_), like the L1 pool: the memory L2 is configured to hold is taken at
        # startup, where a shortage fails loudly, and RSS stays flat as L2 fills
        self.data = torch.empty((capacity, *page_shape), dtype=dtype, pin_memory=pin_memory).zero_()
        self.page_bytes = self.data[0].numel() * self.data.element_size()
        self._bytes = self.data.view(torch.uint8).view(capacity, self.page_bytes).numpy()  # [capacity, page_bytes]
        self.policy = ep.check_policy(policy)
        self.retained_cap = int(ep.check_quota(retention_quota) * capacity)
        self.protected_cap = int(ep.PROTECTED_SHARE * capacity)
        self._index: dict[bytes, int] = {}
        self._segments: tuple[OrderedDict[bytes, float], ...] = (OrderedDict(), OrderedDict(), OrderedDict())
        self._class: dict[bytes, int] = {}
        self.hits_by_class = [0, 0, 0]  # pages given back to L1, by class
        self._free: list[int] = list(range(capacity - 1, -1, -1))
        self._pinned: set[bytes] = set()
        self._held: dict[bytes, int] = {}  # hash -> holders: prefetched pages waiting for their request

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
        """Every held page's hash: evicted-first class first, least recently used first. Read-only."""
        return [h for seg in self._segments for h in seg]

    def class_counts(self) -> list[int]:
        """Held pages per class (probation, protected, retained). Read-only."""
        return [len(seg) for seg in self._segments]

    def pin(self, hashes: Iterable[bytes]) -> None:
        """Changes state: keep these (held) pages through the next puts, until unpin()."""
        self._pinned.update(h for h in hashes if h in self._index)

    def unpin(self) -> None:
        self._pinned.clear()

    def hold(self, hashes: Iterable[bytes]) -> list[bytes]:
        """Changes state: keep these held pages until release() (an L3 prefetch waiting for its
        request's admission: other traffic must not evict it meanwhile). At most half of L2 is held;
        returns the hashes this call holds."""
        got = []
        for h in hashes:
            if h in self._index and (h in self._held or len(self._held) < self.capacity // 2):
                self._held[h] = self._held.get(h, 0) + 1
                got.append(h)
        return got

    def release(self, hashes: Iterable[bytes]) -> None:
        for h in hashes:
            n = self._held.get(h, 0)
            if n > 1:
                self._held[h] = n - 1
            else:
                self._held.pop(h, None)

    def put_from_pool(
        self, pool: PagePool, hashes: list[bytes], pages: list[int], classes: list[tuple[int, float]] | None = None
    ) -> int:
        """Changes state: copy pool pages into L2 (held ones are only refreshed, their class raised),
        each with its (class, retain_until). Returns pages copied."""
        new_hashes, new_pages, new_classes = [], [], []
        for i, (h, p) in enumerate(zip(hashes, pages)):
            cls = classes[i] if classes is not None else (ep.PROBATION, 0.0)
            if h in self._index:
                self._touch(h, cls)
            else:
                new_hashes.append(h)
                new_pages.append(p)
                new_classes.append(cls)
        slots = self._take_slots(new_hashes, new_classes)
        read_pages(pool, new_pages[: len(slots)], self.data, slots)
        return len(slots)

    def put_bytes(self, h: bytes, payload: bytes | memoryview, cls: tuple[int, float] = (ep.PROBATION, 0.0)) -> bool:
        """Changes state: store one page from its bytes (an L3 payload); False if there is no room
        (L2 all pinned, or all retained and this page is not)."""
        if h in self._index:
            self._touch(h, cls)
            return True
        slots = self._take_slots([h], [cls])
        if slots:
            self._bytes[slots[0]] = np.frombuffer(payload, dtype=np.uint8)
        return bool(slots)

    def load_into_pool(self, pool: PagePool, hashes: list[bytes], pages: list[int]) -> None:
        """Copy held pages `hashes` into pool pages `pages` (fresh, owned by the caller); marks them used."""
        slots = []
        for h in hashes:
            slots.append(self._index[h])
            self.hits_by_class[self._class[h]] += 1
            self._touch(h, None)
        write_pages(pool, pages, self.data, slots)

    def page_view(self, h: bytes) -> np.ndarray:
        """The bytes of a held page (a view: valid until the next call that changes state)."""
        return self._bytes[self._index[h]]

    def clear(self) -> int:
        """Changes state: forget every page; returns how many."""
        n = len(self._index)
        self._index.clear()
        self._class.clear()
        for seg in self._segments:
            seg.clear()
        self._pinned.clear()
        self._held.clear()
        self._free = list(range(self.capacity - 1, -1, -1))
        return n

    def check_integrity(self) -> None:
        slots = list(self._index.values())
        if len(set(slots)) != len(slots):
            raise HostTierIntegrityError("a host slot is indexed twice")
        if set(slots) & set(self._free) or len(slots) + len(self._free) != self.capacity:
            raise HostTierIntegrityError(f"indexed {len(slots)} + free {len(self._free)} != {self.capacity}")
        if not self._pinned <= self._index.keys() or not self._held.keys() <= self._index.keys():
            raise HostTierIntegrityError("a pinned or held hash is not indexed")
        if sum(map(len, self._segments)) != len(self._index) or any(
            h not in self._segments[c] for h, c in self._class.items()
        ) or self._class.keys() != self._index.keys():
            raise HostTierIntegrityError("class segments disagree with the index")
        if len(self._segments[ep.RETAINED]) > max(self.retained_cap, 0):
            raise HostTierIntegrityError("retained segment over its quota")

    # -- internals -------------------------------------------------------------------------------

    def _class_of(self, cls: tuple[int, float]) -> int:
        c = ep.effective_class(self.policy, cls[0], cls[1], ep.now())
        if c == ep.RETAINED and self.retained_cap == 0:  # no quota: an ordinary reused page
            return ep.effective_class(self.policy, ep.PROTECTED, 0.0, 0.0)
        return c

    def _place(self, h: bytes, c: int, retain_until: float) -> None:
        """Put held `h` at the recent end of class `c`'s segment, keeping retained within quota."""
        self._class[h] = c
        self._segments[c][h] = retain_until
        if c == ep.RETAINED and len(self._segments[c]) > self.retained_cap:
            old, until = self._segments[c].popitem(last=False)  # the oldest retained page: protected now
            self._demote(old, until)
        if len(self._segments[ep.PROTECTED]) > self.protected_cap:
            old, until = self._segments[ep.PROTECTED].popitem(last=False)  # segmented LRU: back to probation
            self._class[old] = ep.PROBATION
            self._segments[ep.PROBATION][old] = until

    def _demote(self, h: bytes, until: float) -> None:
        """A retained page past its quota or retention: an ordinary reused page from now on."""
        c = ep.effective_class(self.policy, ep.PROTECTED, 0.0, 0.0)
        self._class[h] = c
        self._segments[c][h] = until

    def _touch(self, h: bytes, cls: tuple[int, float] | None) -> None:
        old = self._class[h]
        until = self._segments[old].pop(h)
        c = old if cls is None else max(old, self._class_of(cls))
        self._place(h, c, max(until, cls[1]) if cls is not None else until)

    def _take_slots(self, hashes: list[bytes], classes: list[tuple[int, float]]) -> list[int]:
        """Index `hashes` on free slots, evicting pages of the lowest class first (LRU within it);
        stops when nothing may be evicted for the next page. Returns the slots, one per indexed hash."""
        slots: list[int] = []
        for h, cls in zip(hashes, classes):
            c = self._class_of(cls)
            if not self._free and not self._evict_one(c):
                logger.debug("host_tier_full pinned=%d dropped=%d", len(self._pinned), len(hashes) - len(slots))
                break
            slot = self._free.pop()
            self._index[h] = slot
            self._place(h, c, cls[1])
            slots.append(slot)
        return slots

    def _evict_one(self, incoming: int) -> bool:
        """Free one slot for a page of class `incoming`: retained pages (within their retention and
        the quota) only make room for retained pages."""
        retained = self._segments[ep.RETAINED]
        at = ep.now()
        while retained and next(iter(retained.values())) <= at:  # expired: an ordinary protected page
            self._demote(*retained.popitem(last=False))
        for c in range(ep.RETAINED + 1 if incoming == ep.RETAINED else ep.RETAINED):
            for h in self._segments[c]:
                if h not in self._pinned and h not in self._held:
                    del self._segments[c][h]
                    del self._class[h]
                    self._free.append(self._index.pop(h))
                    return True
        return False
