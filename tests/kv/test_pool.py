from __future__ import annotations

import pytest
import torch

from kvstrata.kv.pool import PagePool, PoolIntegrityError


def make_pool(num_pages: int = 8, page_size: int = 4) -> PagePool:
    return PagePool(num_pages, page_size, layers=2, kv_heads=1, head_dim=2, dtype=torch.float32)


def test_alloc_hands_out_distinct_pages_and_keeps_counts() -> None:
    pool = make_pool(8)
    a = pool.alloc(3)
    b = pool.alloc(5)
    assert a is not None and b is not None
    assert len(set(a) | set(b)) == 8
    assert set(a) | set(b) == set(range(8))
    assert (pool.num_free, pool.num_in_use) == (0, 8)
    pool.check_integrity({"a": a, "b": b})


def test_alloc_too_many_takes_nothing() -> None:
    pool = make_pool(4)
    assert pool.alloc(2) is not None
    assert pool.alloc(3) is None
    assert (pool.num_free, pool.num_in_use) == (2, 2)
    assert pool.alloc(0) == []


def test_free_returns_pages_for_reuse() -> None:
    pool = make_pool(2)
    pages = pool.alloc(2)
    assert pages is not None
    pool.free(pages)
    assert pool.num_free == 2
    assert sorted(pool.alloc(2) or []) == [0, 1]


def test_double_free_and_foreign_free_raise() -> None:
    pool = make_pool(4)
    pages = pool.alloc(2)
    assert pages is not None
    pool.free(pages[:1])
    with pytest.raises(PoolIntegrityError):
        pool.free(pages[:1])
    with pytest.raises(PoolIntegrityError):
        pool.free([3])  # never allocated
    pool.check_integrity({"req": pages[1:]})


def test_integrity_detects_leak_shared_owner_and_stale_owner() -> None:
    pool = make_pool(4)
    pages = pool.alloc(3)
    assert pages is not None
    pool.check_integrity()
    with pytest.raises(PoolIntegrityError, match="without owner"):
        pool.check_integrity({"req": pages[:2]})
    with pytest.raises(PoolIntegrityError, match="held by both"):
        pool.check_integrity({"req": pages, "cache": pages[:1]})
    pool.free(pages[2:])
    with pytest.raises(PoolIntegrityError, match="not in use"):
        pool.check_integrity({"req": pages})


def test_bytes_per_page_and_bad_sizes() -> None:
    # 2 (k, v) * 3 layers * 16 tokens * 2 heads * 8 dims * 2 bytes
    assert PagePool.bytes_per_page(16, 3, 2, 8, torch.float16) == 2 * 3 * 16 * 2 * 8 * 2
    with pytest.raises(ValueError):
        make_pool(0)
    with pytest.raises(ValueError):
        make_pool(4, page_size=0)
