"""HostTier (L2): byte-identical pages after L1 -> L2 -> L1, LRU order, pins, holds, and the radix hooks."""
from __future__ import annotations

import pytest
import torch

from kvstrata.kv.hashing import namespace_root
from kvstrata.kv.host_tier import HostTier
from kvstrata.kv.page_io import page_shape, snapshot_pages
from kvstrata.kv.pool import PagePool
from kvstrata.kv.radix import RadixPrefixCache
from kvstrata.kv.tier_stats import TierStats
from kvstrata.kv.tiers import KVTiers

PS = 4


def filled_pool(dtype: torch.dtype, num_pages: int = 8) -> PagePool:
    pool = PagePool(num_pages, PS, layers=3, kv_heads=2, head_dim=4, dtype=dtype)
    g = torch.Generator().manual_seed(0)
    for t in pool.k + pool.v:
        t.copy_(torch.randn(t.shape, generator=g).to(dtype))
    return pool


def page_bytes(pool: PagePool, page: int) -> bytes:
    return snapshot_pages(pool, [page]).view(torch.uint8).numpy().tobytes()


def h(i: int) -> bytes:
    return i.to_bytes(32, "big")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_pages_are_byte_identical_after_l1_l2_l1(dtype: torch.dtype) -> None:
    pool = filled_pool(dtype)
    before = {p: page_bytes(pool, p) for p in range(8)}
    host = HostTier(4, page_shape(pool), dtype)
    assert host.put_from_pool(pool, [h(1), h(2), h(3)], [5, 0, 7]) == 3
    for t in pool.k + pool.v:
        t.zero_()
    host.load_into_pool(pool, [h(3), h(1), h(2)], [1, 2, 6])
    assert page_bytes(pool, 1) == before[7]
    assert page_bytes(pool, 2) == before[5]
    assert page_bytes(pool, 6) == before[0]
    assert bytes(host.page_view(h(2))) == before[0]
    assert page_bytes(pool, 0) == bytes(len(before[0]))  # nothing else written
    host.check_integrity()


def test_match_counts_the_leading_run() -> None:
    pool = filled_pool(torch.float32)
    host = HostTier(4, page_shape(pool), torch.float32)
    host.put_from_pool(pool, [h(1), h(2), h(4)], [0, 1, 2])
    assert host.match([h(1), h(2), h(3), h(4)]) == 2
    assert host.match([h(3), h(1)]) == 0
    assert host.match([]) == 0


def test_least_recently_used_goes_first_and_pins_hold() -> None:
    pool = filled_pool(torch.float32)
    host = HostTier(3, page_shape(pool), torch.float32)
    host.put_from_pool(pool, [h(1), h(2), h(3)], [0, 1, 2])
    host.load_into_pool(pool, [h(1)], [7])  # 1 is now the most recently used
    host.put_from_pool(pool, [h(4)], [3])
    assert h(2) not in host and all(x in host for x in (h(1), h(3), h(4)))
    host.pin([h(3), h(4), h(1)])
    assert host.put_from_pool(pool, [h(5)], [4]) == 0  # everything pinned: the new page is dropped
    assert h(5) not in host
    host.check_integrity()
    host.unpin()
    assert host.put_from_pool(pool, [h(5)], [4]) == 1 and h(3) not in host
    assert host.clear() == 3 and host.num_pages == 0
    host.check_integrity()


@pytest.mark.parametrize("policy", ["lru", "slru"])
def test_held_prefetch_survives_other_traffic_until_released(policy: str) -> None:
    """Pages an L3 prefetch brought for a waiting request stay in L2 whatever L1 evicts into it
    (at most half of L2 is held); released, they are ordinary pages again."""
    pool = filled_pool(torch.float32)
    host = HostTier(4, page_shape(pool), torch.float32, policy=policy)
    payload = page_bytes(pool, 0)
    for i in (1, 2, 3):
        assert host.put_bytes(h(i), payload)
    assert host.hold([h(1), h(2), h(3)]) == [h(1), h(2)]  # half of L2 at most
    protected = [(1, 0.0)] * 4  # L1 victims of session continuations: protected under slru
    host.put_from_pool(pool, [h(10), h(11), h(12), h(13)], [1, 2, 3, 4], protected)
    assert h(1) in host and h(2) in host and h(3) not in host
    host.check_integrity()
    host.hold([h(1)])  # a second request waits on page 1 too
    host.release([h(1), h(2)])
    host.put_from_pool(pool, [h(20), h(21)], [5, 6], protected[:2])
    assert h(1) in host and h(2) not in host  # page 1 is still held by the second request
    host.release([h(1)])
    host.put_from_pool(pool, [h(22), h(23)], [5, 6], protected[:2])
    assert h(1) not in host
    host.check_integrity()


def test_put_bytes_stores_an_l3_payload() -> None:
    pool = filled_pool(torch.bfloat16)
    host = HostTier(2, page_shape(pool), torch.bfloat16)
    payload = page_bytes(pool, 3)
    assert host.put_bytes(h(9), payload)
    host.load_into_pool(pool, [h(9)], [0])
    assert page_bytes(pool, 0) == payload


def test_radix_evictions_land_in_l2_before_reuse() -> None:
    pool = filled_pool(torch.float32, num_pages=4)
    cache = RadixPrefixCache(pool, PS, namespace_root("m", "float32", PS, "test"))
    tiers = KVTiers(cache, HostTier(8, page_shape(pool), torch.float32), TierStats())
    tokens = list(range(3 * PS))
    pages = pool.alloc(3)
    assert pages is not None
    want = [page_bytes(pool, p) for p in pages]
    assert cache.insert(tokens, pages) == []
    hashes = cache.match(tokens + [0]).hashes
    evicted = cache.evict(3)
    assert sorted(evicted.pages) == sorted(pages) and pool.num_free == 4
    for t in pool.k + pool.v:
        t.zero_()  # the pages are reused
    assert tiers.host.match(hashes) == 3
    fresh = pool.alloc(3)
    assert fresh is not None
    tiers.load_host(hashes, fresh)
    assert [page_bytes(pool, p) for p in fresh] == want
    snap = tiers.stats.snapshot()
    assert snap.writes["host"] == 3 and snap.reads["host"] == 3
    assert snap.bytes["host"] == 6 * tiers.host.page_bytes
    tiers.check_integrity()
