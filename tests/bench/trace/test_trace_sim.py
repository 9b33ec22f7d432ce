"""The trace simulator (the real radix cache, HostTier, StoreWriter, Prefetcher) against brute force.

The brute-force L1 model: a set of cached block paths, each stamped with the last request whose
path it was on. A request matches its longest cached leading run, locks it, and when the pool
(cached pages + its own) lacks room evicts the unlocked leaf with the oldest stamp, one at a time;
afterwards every block of its path is cached with its stamp. (The radix cache's LRU over leaves,
written plainly: all nodes of one request's path share a stamp, so leaves never tie.)
"""
from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstrata.bench.trace.format import TraceRequest, ideal_hit_rate, leading_seen
from kvstrata.bench.trace.sim import scaled_ideal, simulate
from kvstrata.bench.trace.sim_store import UNBOUNDED, Capacity, LruCapStore, parse_capacities
from kvstrata.bench.trace.tokens import BlockTokens

TB = 512


def random_trace(seed: int, n: int = 30) -> list[TraceRequest]:
    """Conversations: a request continues an earlier one's leading ids (any cut) or starts fresh."""
    rng = random.Random(seed)
    out: list[TraceRequest] = []
    fresh = 0
    for i in range(n):
        ids: list[int] = []
        if out and rng.random() < 0.7:
            base = rng.choice(out).hash_ids
            ids = list(base[: rng.randint(1, len(base))])
        for _ in range(rng.randint(0 if ids else 1, 5)):
            ids.append(fresh)
            fresh += 1
        n_in = rng.randint((len(ids) - 1) * TB + 1, len(ids) * TB)
        out.append(TraceRequest(i + 1, float(i), n_in, 4, tuple(ids)))
    return out


def brute_l1(requests: list[TraceRequest], pages: int) -> list[int]:
    """Hit blocks per request of an L1 of `pages` pages (pad mode: n blocks + 1 partial page)."""
    cache: dict[tuple[int, ...], int] = {}
    hits = []
    for clock, r in enumerate(requests):
        ids = r.hash_ids
        k = 0
        while k < len(ids) and ids[: k + 1] in cache:
            k += 1
        locked = {ids[:j] for j in range(1, k + 1)}
        need = len(ids) + 1 - k
        while pages - len(cache) < need:
            leaves = [p for p in cache if p not in locked and not any(q[:-1] == p for q in cache)]
            del cache[min(leaves, key=lambda p: cache[p])]
        for j in range(1, len(ids) + 1):
            cache[ids[:j]] = clock
        hits.append(k)
    return hits


def trace_tokens(requests: list[TraceRequest], hits: list[int]) -> float:
    return sum(min(k * TB, r.input_length) for k, r in zip(hits, requests)) / sum(r.input_length for r in requests)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(6, 60), st.sampled_from([1, 4, 16]))
def test_l1_matches_brute_force_lru(seed: int, pages: int, block: int) -> None:
    reqs = random_trace(seed)
    pages = max(pages, max(len(r.hash_ids) for r in reqs) + 1)
    res = simulate(reqs, BlockTokens(block), Capacity(pages * block))
    assert res.hit_tokens["host"] == res.hit_tokens["store"] == 0
    assert res.rate() == pytest.approx(trace_tokens(reqs, brute_l1(reqs, pages)), abs=1e-12)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10**6), st.integers(6, 30))
def test_unbounded_l2_keeps_l1_as_is_and_reaches_the_ideal(seed: int, pages: int) -> None:
    reqs = random_trace(seed)
    pages = max(pages, max(len(r.hash_ids) for r in reqs) + 1)
    res = simulate(reqs, BlockTokens(4), Capacity(pages * 4, UNBOUNDED))
    alone = brute_l1(reqs, pages)
    assert res.rate("device") == pytest.approx(trace_tokens(reqs, alone), abs=1e-12)
    assert res.rate() == pytest.approx(ideal_hit_rate(reqs), abs=1e-12)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from([1, 2, 8]))
def test_unbounded_is_exactly_the_ideal_at_any_block_size(seed: int, block: int) -> None:
    reqs = random_trace(seed, 40)
    assert simulate(reqs, BlockTokens(block), Capacity(UNBOUNDED)).rate() == ideal_hit_rate(reqs)


def page_ideal(requests: list[TraceRequest], mp: BlockTokens, ps: int) -> float:
    """Brute force of "cut" mode: longest common prefix with an earlier prompt's full pages."""
    prompts = [mp.prompt(r) for r in requests]
    hit = 0
    for i, p in enumerate(prompts):
        best = 0
        for q in prompts[:i]:
            lcp = 0
            while lcp < min(len(p), len(q) // ps * ps) and p[lcp] == q[lcp]:
                lcp += 1
            best = max(best, lcp // ps * ps)
        hit += min(best, (len(p) - 1) // ps * ps)
    return hit / sum(len(p) for p in prompts)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from([(4, 4), (8, 4), (16, 16), (4, 8)]))
def test_cut_mode_is_what_a_paged_cache_can_reach(seed: int, block_page: tuple[int, int]) -> None:
    block, ps = block_page
    reqs = random_trace(seed, 25)
    mp = BlockTokens(block)
    res = simulate(reqs, mp, Capacity(UNBOUNDED), "cut", ps)
    assert res.rate() == pytest.approx(page_ideal(reqs, mp, ps), abs=1e-12)
    assert res.rate() <= scaled_ideal(reqs, mp) + 1e-12


def test_l3_catches_what_l1_and_l2_drop() -> None:
    reqs = random_trace(7, 60)
    need = max(len(r.hash_ids) for r in reqs) + 1
    mp = BlockTokens(4)
    l1 = simulate(reqs, mp, Capacity(need * 4))
    l2 = simulate(reqs, mp, Capacity(need * 4, need * 4))
    l3 = simulate(reqs, mp, Capacity(need * 4, need * 4, UNBOUNDED))
    assert l1.rate() < l2.rate() < l3.rate() <= ideal_hit_rate(reqs) + 1e-12
    assert l3.hit_tokens["store"] > 0
    assert l1.rate("device") == l2.rate("device")  # L2 hits land in L1 as the same misses would


def test_tiny_l1_is_refused() -> None:
    reqs = random_trace(1)
    with pytest.raises(ValueError, match="L1 must hold the longest request"):
        simulate(reqs, BlockTokens(4), Capacity(4))


def test_store_model_evicts_like_the_file_store() -> None:
    store = LruCapStore(10)
    store.batch_put([f"k{i}" for i in range(10)], [b"v"] * 10)
    assert store.batch_get(["k0"]) == [b"v"]  # a read makes k0 recent
    assert store.batch_exists(["k1", "k2"]) == 2  # an existence probe does not
    store.batch_put(["k10"], [b"v"])  # 11 > 10: down to 9, oldest first
    assert len(store) == 9 and store.batch_exists(["k0"]) == 1 and store.batch_exists(["k1"]) == 0


def test_capacities_parse() -> None:
    caps = parse_capacities("8k, 8k:32k, 1.5M:inf:inf")
    assert caps == [Capacity(8000), Capacity(8000, 32000), Capacity(1_500_000, math.inf, math.inf)]
    assert [c.label() for c in caps] == ["8k", "8k:32k", "1.5M:inf:inf"]
    for bad, msg in (("8q", "not a token count"), ("8k:0:5k", "an L3 needs an L2"), ("1:2:3:4", "at most three")):
        with pytest.raises(ValueError, match=msg):
            parse_capacities(bad)


def test_leading_seen_is_what_the_ideal_counts() -> None:
    reqs = random_trace(3)
    assert ideal_hit_rate(reqs) == trace_tokens(reqs, leading_seen(reqs))
