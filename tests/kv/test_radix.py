"""The radix prefix cache (kvstrata/kv/radix.py) case by case: whole-page matches, inserts and their
duplicates, locks, LRU eviction, extra keys, hooks, reset and the chain hashes (the brute-force model
comparison: test_radix_model.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kvstrata.kv.hashing import chain_hash, hash_pages, namespace_root, salt_bytes, token_bytes
from kvstrata.kv.pool import PagePool
from kvstrata.kv.radix import RadixPrefixCache

PS = 4
ROOT = namespace_root("test/model", "float32", PS, "nhd")


def make_cache(num_pages: int = 32, page_size: int = PS) -> tuple[PagePool, RadixPrefixCache]:
    pool = PagePool(num_pages, page_size, layers=1, kv_heads=1, head_dim=1, dtype=torch.float32)
    return pool, RadixPrefixCache(pool, page_size, namespace_root("test/model", "float32", page_size, "nhd"))


def alloc(pool: PagePool, n: int) -> list[int]:
    pages = pool.alloc(n)
    assert pages is not None
    return pages


def cache_tokens(pool: PagePool, cache: RadixPrefixCache, tokens: list[int], key: str | None = None) -> list[int]:
    """Insert `tokens` as a finished request would; returns the pages the cache now holds for it."""
    pages = alloc(pool, len(tokens) // cache.page_size)
    assert cache.insert(tokens, pages, key) == []
    return pages


def check(pool: PagePool, cache: RadixPrefixCache, **held: list[int]) -> None:
    cache.check_integrity()
    pool.check_integrity({"cache": sorted(cache.cached_pages()), **held})


def test_match_whole_pages_and_never_the_last_token() -> None:
    pool, cache = make_cache()
    tokens = list(range(12))
    pages = cache_tokens(pool, cache, tokens)
    for length, expect in [(12, 2), (13, 3), (9, 2), (8, 1), (5, 1), (4, 0), (1, 0), (0, 0)]:
        m = cache.match((tokens + [99])[:length])
        assert m.pages == pages[:expect], length
        assert m.num_tokens == expect * PS
        assert m.hashes == hash_pages(tokens, PS, ROOT)[:expect]
    check(pool, cache)


def test_match_stops_at_first_differing_page() -> None:
    pool, cache = make_cache()
    tokens = list(range(16))
    pages = cache_tokens(pool, cache, tokens)
    assert cache.match(tokens[:6] + [77] + tokens[7:]).pages == pages[:1]  # differs inside page 1
    assert cache.match([5] + tokens[1:]).pages == []
    assert cache.match(np.array(tokens + [0])).pages == pages  # numpy prompts work too


def test_insert_ignores_partial_page_and_extra_pages() -> None:
    pool, cache = make_cache()
    pages = alloc(pool, 4)
    assert cache.insert(list(range(10)), pages) == []
    assert cache.cached_pages() == set(pages[:2])
    check(pool, cache, req=pages[2:])


def test_duplicates_are_returned_and_tree_keeps_its_own() -> None:
    pool, cache = make_cache()
    tokens = list(range(12))
    first = cache_tokens(pool, cache, tokens[:8])
    mine = alloc(pool, 3)
    dups = cache.insert(tokens, mine)
    assert dups == mine[:2]
    assert cache.cached_pages() == set(first) | {mine[2]}
    pool.free(dups)
    check(pool, cache)
    assert cache.match(tokens + [0]).pages == first + [mine[2]]


def test_reinserting_own_pages_while_prefill_grows_is_not_a_duplicate() -> None:
    pool, cache = make_cache()
    tokens = list(range(20))
    pages = alloc(pool, 5)
    assert cache.insert(tokens[:8], pages[:2]) == []
    assert cache.insert(tokens[:16], pages[:4]) == []
    assert cache.insert(tokens, pages) == []
    assert cache.insert(tokens, pages) == []
    assert cache.cached_pages() == set(pages)
    check(pool, cache)


def test_running_request_swaps_in_tree_pages_after_duplicates() -> None:
    """The ownership contract end to end: insert, free duplicates, re-match, relock."""
    pool, cache = make_cache()
    tokens = list(range(13))
    other = cache_tokens(pool, cache, tokens[:8])
    start = cache.match([100] * 13)  # our request found nothing and computed everything itself
    cache.lock(start.node)
    mine = alloc(pool, 4)
    dups = cache.insert(tokens[:12], mine[:3])
    pool.free(dups)
    rematch = cache.match(tokens[:12] + [tokens[12]])
    cache.lock(rematch.node)
    cache.unlock(start.node)
    table = rematch.pages + mine[3:]
    assert table == other + [mine[2], mine[3]]
    assert cache.evict(100).pages == []  # everything it uses is locked
    check(pool, cache, req=[mine[3]])


def test_insert_rejects_bad_pages_without_changing_state() -> None:
    pool, cache = make_cache()
    tokens = list(range(8))
    pages = cache_tokens(pool, cache, tokens)
    with pytest.raises(ValueError):
        cache.insert(list(range(8)), pages[:1])  # too few pages
    with pytest.raises(ValueError):
        cache.insert([50] * 8, [pages[0], pages[0]])
    with pytest.raises(ValueError, match="already cached"):
        cache.insert([50] * 8, [pages[1], 30])  # page 1 is the tree's, at another prefix
    with pytest.raises(ValueError, match="already cached"):
        cache.insert(tokens[:4] + [50] * 4, [pages[1], 30])  # a "duplicate" the tree owns
    check(pool, cache)
    with pytest.raises(ValueError):
        RadixPrefixCache(pool, PS * 2, ROOT)


def test_lock_prevents_eviction_of_path_but_not_descendants() -> None:
    pool, cache = make_cache()
    a = cache_tokens(pool, cache, list(range(12)))
    b = cache_tokens(pool, cache, [50] * 8)
    node = cache.match(list(range(5))).node  # first page of a
    cache.lock(node)
    assert cache.num_evictable_pages == 4
    freed = cache.evict(100)
    assert sorted(freed.pages) == sorted(a[1:] + b)
    assert cache.cached_pages() == {a[0]}
    assert cache.num_evictable_pages == 0
    check(pool, cache)
    cache.unlock(node)
    assert cache.num_evictable_pages == 1
    assert cache.evict(1).pages == [a[0]]
    check(pool, cache)


def test_locks_nest_and_unbalanced_unlock_raises() -> None:
    pool, cache = make_cache()
    cache_tokens(pool, cache, list(range(8)))
    node = cache.match(list(range(9))).node
    cache.lock(node)
    cache.lock(node)
    cache.unlock(node)
    assert cache.evict(10).pages == []
    cache.unlock(node)
    with pytest.raises(ValueError):
        cache.unlock(node)
    assert len(cache.evict(10).pages) == 2
    with pytest.raises(ValueError, match="no longer in the cache"):
        cache.lock(node)
    check(pool, cache)


def test_evicts_least_recently_used_leaf_first() -> None:
    pool, cache = make_cache()
    a = cache_tokens(pool, cache, [1] * 8)
    b = cache_tokens(pool, cache, [2] * 8)
    c = cache_tokens(pool, cache, [3] * 8)
    m = cache.match([1] * 9)
    cache.lock(m.node)  # a becomes most recent
    cache.unlock(m.node)
    cache.match([2] * 9)  # match is read-only: b stays older than c
    order = [cache.evict(1).pages[0] for _ in range(6)]
    assert order == [b[1], b[0], c[1], c[0], a[1], a[0]]
    assert cache.evict(1).pages == [] and cache.num_cached_pages == 0
    check(pool, cache)


def test_evicting_a_leaf_exposes_its_parent_at_the_parents_own_time() -> None:
    pool, cache = make_cache()
    a = cache_tokens(pool, cache, [1] * 8)
    b = cache_tokens(pool, cache, [2] * 4)
    first = cache.match([1] * 5).node
    cache.lock(first)  # a[0] is now newer than b, a[1] older
    cache.unlock(first)
    assert cache.evict(2).pages == [a[1], b[0]]
    assert cache.evict(2).pages == [a[0]]
    check(pool, cache)


def test_insert_refreshes_lru() -> None:
    pool, cache = make_cache()
    a = cache_tokens(pool, cache, [1] * 4)
    b = cache_tokens(pool, cache, [2] * 4)
    assert cache.insert([1] * 4, a) == []
    assert cache.evict(1).pages == b
    check(pool, cache)


def test_extra_keys_never_share_pages() -> None:
    pool, cache = make_cache()
    tokens = list(range(8))
    plain = cache_tokens(pool, cache, tokens)
    salted = cache_tokens(pool, cache, tokens, "tenant-a")  # no duplicates: separate subtree
    assert cache.match(tokens + [0]).pages == plain
    assert cache.match(tokens + [0], "").pages == plain
    assert cache.match(tokens + [0], "tenant-a").pages == salted
    assert cache.match(tokens + [0], "tenant-b").pages == []
    assert cache.match(tokens + [0], "tenant-a").hashes == hash_pages(tokens, PS, ROOT, "tenant-a")
    assert set(cache.match(tokens + [0], "tenant-a").hashes).isdisjoint(cache.match(tokens + [0]).hashes)
    check(pool, cache)
    cache.evict(100)
    assert cache.match(tokens + [0], "tenant-a").pages == []
    check(pool, cache)


def test_hooks_see_new_and_evicted_pages_with_chain_hashes() -> None:
    pool, cache = make_cache()
    inserted: list[tuple[list[bytes], list[int], list[list[int]], bytes | None]] = []
    evicted: list[tuple[list[bytes], list[int], int]] = []
    cache.on_insert.append(lambda h, p, t, parent: inserted.append((h, p, t, parent)))
    cache.on_evict.append(lambda h, p: evicted.append((h, p, pool.num_in_use)))
    tokens = list(range(100, 112))
    hashes = hash_pages(tokens, PS, ROOT, "s")
    pages = alloc(pool, 3)
    cache.insert(tokens[:4], pages[:1], "s")
    cache.insert(tokens, pages, "s")
    cache.insert(tokens, pages, "s")  # nothing new: no call
    assert inserted == [
        ([hashes[0]], pages[:1], [tokens[:4]], None),
        (hashes[1:], pages[1:], [tokens[4:8], tokens[8:]], hashes[0]),
    ]
    in_use = pool.num_in_use
    cache.evict(2)
    assert evicted == [([hashes[2], hashes[1]], [pages[2], pages[1]], in_use)]  # before the free
    assert pool.num_in_use == in_use - 2
    check(pool, cache)


def test_reset_drops_unlocked_keeps_locked_paths() -> None:
    pool, cache = make_cache()
    a = cache_tokens(pool, cache, list(range(12)))
    b = cache_tokens(pool, cache, [7] * 8, "t")
    seen: list[int] = []
    cache.on_evict.append(lambda h, p: seen.extend(p))
    node = cache.match(list(range(9))).node
    cache.lock(node)
    freed = cache.reset()
    assert sorted(freed) == sorted(a[2:] + b) == sorted(seen)
    assert cache.cached_pages() == set(a[:2])
    assert cache.match(list(range(13))).pages == a[:2]
    check(pool, cache)
    cache.unlock(node)
    assert sorted(cache.reset()) == sorted(a[:2])
    assert cache.num_cached_pages == 0 and pool.num_in_use == 0
    check(pool, cache)


def test_node_hashes_follow_the_chain_definition() -> None:
    pool, cache = make_cache()
    tokens = list(range(8))
    cache_tokens(pool, cache, tokens, "k")
    h0 = chain_hash(ROOT, token_bytes(tokens[:4]), salt_bytes("k"))
    assert cache.match(tokens + [1], "k").hashes == [h0, chain_hash(h0, token_bytes(tokens[4:]), b"k")]


def test_lru_heap_stays_bounded_under_lock_churn() -> None:
    pool, cache = make_cache()
    a = cache_tokens(pool, cache, [1] * 8)
    b = cache_tokens(pool, cache, [2] * 8)
    node_a, node_b = cache.match([1] * 9).node, cache.match([2] * 9).node
    for i in range(500):
        node = node_a if i % 2 else node_b  # a is touched last
        cache.lock(node)
        cache.unlock(node)
    assert len(cache._evictor.heap) <= 2 * cache.num_cached_pages + 65  # stale entries get compacted
    check(pool, cache)
    assert cache.evict(4).pages == [b[1], b[0], a[1], a[0]]
