"""RadixPrefixCache.extend: continuing a locked path below its node, without a walk from the root."""
from __future__ import annotations

import pytest

from kvstrata.kv import radix
from tests.kv.test_radix import alloc, cache_tokens, check, make_cache


def test_extend_matches_insert_and_reports_the_trees_pages() -> None:
    pool, cache = make_cache()
    tokens = list(range(20))
    other = cache_tokens(pool, cache, tokens[:12])  # someone cached 3 pages first
    start = cache.match(tokens[:5])  # our request's node after 1 page
    cache.lock(start.node)
    mine = alloc(pool, 4)
    dups, m = cache.extend(start.node, tokens[4:20], mine, "")
    assert dups == mine[:2]  # pages 1-2 were cached already: the caller frees its copies
    assert m.pages == other[1:] + mine[2:] and m.num_tokens == 16
    assert m.node is cache.match(tokens + [0]).node and m.hashes == cache.match(tokens + [0]).hashes[1:]
    pool.free(dups)
    cache.lock(m.node)
    cache.unlock(start.node)
    check(pool, cache)


def test_extend_from_the_top_creates_the_subtree_and_fires_hooks() -> None:
    pool, cache = make_cache()
    seen: list[tuple[int, bytes | None]] = []
    cache.on_insert.append(lambda hashes, pages, toks, parent: seen.append((len(pages), parent)))
    top = cache.match([1, 2, 3, 4, 5], "tenant").node  # no subtree yet: the top node
    cache.lock(top)
    pages = alloc(pool, 2)
    dups, m = cache.extend(top, list(range(8)), pages, "tenant")
    assert dups == [] and m.pages == pages and seen == [(2, None)]
    assert cache.match(list(range(9)), "tenant").pages == pages and cache.match(list(range(9))).pages == []
    more = alloc(pool, 1)
    cache.lock(m.node)
    cache.unlock(top)
    _, m2 = cache.extend(m.node, list(range(8, 12)), more, "tenant")
    assert seen[-1] == (1, m.hashes[-1])  # parent hash: the page it hangs from
    cache.lock(m2.node)
    cache.unlock(m.node)
    check(pool, cache)


def test_extend_converts_only_the_new_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk starts at the node: tokens of the prefix above it are never packed or compared."""
    pool, cache = make_cache(num_pages=64)
    packed: list[int] = []
    real = radix.token_bytes
    monkeypatch.setattr(radix, "token_bytes", lambda toks: packed.append(len(toks)) or real(toks))
    node = cache.match([0], "").node
    cache.lock(node)
    for step in range(10):  # a request growing a page at a time
        page = alloc(pool, 1)
        _, m = cache.extend(node, list(range(step * 4, step * 4 + 4)), page, "")
        cache.lock(m.node)
        cache.unlock(node)
        node = m.node
    assert packed == [4] * 10
    assert cache.match(list(range(41))).num_tokens == 40
    check(pool, cache)


def test_extend_refuses_stale_or_unlocked_nodes() -> None:
    pool, cache = make_cache()
    pages = cache_tokens(pool, cache, list(range(8)))
    node = cache.match(list(range(9))).node
    with pytest.raises(ValueError, match="unlocked"):
        cache.extend(node, [9, 9, 9, 9], alloc(pool, 1))
    cache.evict(2)
    with pytest.raises(ValueError, match="no longer in the cache"):
        cache.extend(node, [9, 9, 9, 9], alloc(pool, 1))
    assert pages and cache.num_cached_pages == 0


def test_extend_sets_the_class_of_new_pages_and_raise_class_the_path_above() -> None:
    from kvstrata.kv import eviction_policy as ep

    pool, cache = make_cache()
    tokens = list(range(16))
    cache_tokens(pool, cache, tokens[:8])  # 2 pages another request cached, probation
    start = cache.match(tokens[:9])
    cache.lock(start.node)
    _, m = cache.extend(start.node, tokens[8:16], alloc(pool, 2), "", ep.RETAINED, 123.0)
    below = cache.match(tokens + [0])
    new_nodes, old_nodes = [], []
    n = below.node
    while n is not None and n.page is not None:
        (new_nodes if n.page in m.pages else old_nodes).append(n)
        n = n.parent
    assert [(x.cls, x.retain_until) for x in new_nodes] == [(ep.RETAINED, 123.0)] * 2
    assert [x.cls for x in old_nodes] == [ep.PROBATION] * 2  # extend leaves the path above alone
    cache.raise_class(start.node, ep.RETAINED, 123.0)
    assert [(x.cls, x.retain_until) for x in old_nodes] == [(ep.RETAINED, 123.0)] * 2
    cache.raise_class(start.node, ep.PROBATION, 0.0)  # never lowers
    assert [x.cls for x in old_nodes] == [ep.RETAINED] * 2
    cache.lock(m.node)
    cache.unlock(start.node)
    check(pool, cache)
