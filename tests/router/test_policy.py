"""Routing policies as tables: given each rank's load and cached match, which rank gets the request."""
from __future__ import annotations

from dataclasses import replace

import pytest

from kvstrata.config_server import RouterConfig
from kvstrata.kv.event_wire import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from kvstrata.router.cache_index import RankCacheIndex
from kvstrata.router.policy import CacheAware, CostAware, LeastLoad, RankLoad, RoundRobin, make_policy

CFG = RouterConfig()  # cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5


def ranks(*rows: tuple[int, int, int]) -> list[RankLoad]:
    """(requests in flight, tokens in flight, matched tokens) per rank."""
    return [RankLoad(i, req, tok, match) for i, (req, tok, match) in enumerate(rows)]


# prompt of 1000 tokens throughout
CACHE_AWARE_TABLE = [
    # (requests, tokens, match) per rank                 -> rank, reason
    ([(0, 0, 900), (0, 0, 0)], 0, "cache_match"),  # longest match wins
    ([(5, 9000, 900), (0, 0, 100)], 0, "cache_match"),  # busier, but balanced (5 - 0 <= 64)
    ([(0, 0, 100), (3, 3000, 800)], 1, "cache_match"),
    ([(70, 70000, 900), (2, 2000, 0)], 1, "imbalanced"),  # 68 > 64 and 70 > 1.5 * 2: least loaded
    ([(70, 70000, 900), (60, 60000, 0)], 0, "cache_match"),  # 10 apart: still balanced
    ([(0, 5000, 300), (0, 100, 0)], 1, "cache_miss"),  # 0.3 is not > 0.3: least tokens
    ([(0, 5000, 301), (0, 100, 0)], 0, "cache_match"),
    ([(2, 800, 900), (1, 900, 900)], 0, "cache_match"),  # tie on match: fewer tokens in flight
    ([(0, 0, 0), (0, 0, 0), (1, 10, 0)], 0, "cache_miss"),  # nothing cached: least loaded
]


# prompt of 1000 tokens, decode_cost_tokens 32 (the default)
COST_TABLE = [
    # (requests, matched tokens, queued prefill tokens) per rank  -> rank
    ([(0, 900, 0), (0, 0, 0)], 0),  # the match: 100 tokens to compute against 1000
    ([(1, 900, 4000), (0, 0, 0)], 1),  # a shared prefix queued behind 4000 tokens: computed on the idle rank
    ([(1, 900, 500), (0, 0, 0)], 0),  # a short queue: still the match (100 + 500 + 32 < 1000)
    ([(30, 900, 0), (0, 0, 0)], 1),  # 30 decoding requests (960 tokens' worth) + 100 > 1000
    ([(28, 900, 0), (0, 0, 0)], 0),  # 896 + 100 < 1000
    ([(0, 0, 0), (0, 0, 0), (1, 0, 0)], 0),  # nothing cached, all idle: least loaded, then rotation
]


@pytest.mark.parametrize("rows, want", COST_TABLE)
def test_cost_table(rows: list[tuple[int, int, int]], want: int) -> None:
    loads = [RankLoad(i, req, 0, match, queued) for i, (req, match, queued) in enumerate(rows)]
    d = CostAware(CFG).choose(loads, 1000)
    assert (d.rank, d.reason) == (want, "cost")
    assert d.match_ratio == rows[want][1] / 1000


def test_cost_prices_a_shared_prefix_as_held_on_every_rank() -> None:
    """A fleet's shared 900 tokens cached on rank 0 alone: by match a new session goes there whatever its
    load; priced as held everywhere, the idle rank computes it once and takes the session."""
    loads = [RankLoad(0, 2, 0, 900, 0), RankLoad(1, 0, 0, 0, 0)]
    assert CostAware(CFG).choose(loads, 1000).rank == 0
    assert CostAware(CFG).choose(loads, 1000, shared_tokens=900).rank == 1
    # a session's own history (not shared) keeps its cost where it is cached
    assert CostAware(CFG).choose([RankLoad(0, 2, 0, 990, 0), RankLoad(1, 0, 0, 0, 0)], 1000, shared_tokens=900).rank == 0


def test_cost_counts_the_sessions_homed_on_a_rank_where_more_than_its_requests() -> None:
    """Both ranks hold the prefix; rank 0 is home to 3 sessions, 2 of them in flight now, rank 1 to 4, none
    in flight: by requests alone a new session goes to rank 1 (a fifth session there), by sessions to rank 0."""
    loads = [RankLoad(0, 2, 0, 900, 0, sessions=3), RankLoad(1, 0, 0, 900, 0, sessions=4)]
    assert CostAware(CFG).choose(loads, 1000).rank == 0
    assert CostAware(CFG).choose([replace(r, sessions=0) for r in loads], 1000).rank == 1
    # in-flight requests above the sessions (requests of no session) still count
    assert CostAware(CFG).choose([RankLoad(0, 6, 0, 900, 0, sessions=3), RankLoad(1, 0, 0, 900, 0, sessions=4)],
                                 1000).rank == 1


def test_cost_weighs_decode_load_by_the_flag() -> None:
    loads = [RankLoad(0, 30, 0, 900, 0), RankLoad(1, 0, 0, 0, 0)]
    assert CostAware(RouterConfig(decode_cost_tokens=0)).choose(loads, 1000).rank == 0
    assert make_policy(RouterConfig(policy="cost")).name == "cost"


@pytest.mark.parametrize("rows, want, reason", CACHE_AWARE_TABLE)
def test_cache_aware_table(rows: list[tuple[int, int, int]], want: int, reason: str) -> None:
    d = CacheAware(CFG).choose(ranks(*rows), 1000)
    assert (d.rank, d.reason) == (want, reason)
    assert d.match_ratio == rows[want][2] / 1000


def test_cache_aware_imbalance_needs_both_thresholds() -> None:
    policy = CacheAware(CFG)
    # 100 - 50 = 50 <= 64: balanced, the match wins even though rank 0 has twice the requests
    assert policy.choose(ranks((100, 1, 900), (50, 1000, 0)), 1000).rank == 0
    # 200 - 130 = 70 > 64 but 200 <= 1.5 * 130: balanced
    assert policy.choose(ranks((200, 1, 900), (130, 1000, 0)), 1000).rank == 0
    # 200 - 100 = 100 > 64 and 200 > 150: unbalanced, least loaded (tokens) wins
    assert policy.choose(ranks((200, 1, 900), (100, 1000, 0)), 1000).reason == "imbalanced"


def test_cache_aware_never_piles_onto_the_biggest_cache_when_nothing_matches() -> None:
    """SGLang's old death spiral: 'smallest tree' regardless of load. Here a miss goes by load."""
    policy = CacheAware(CFG)
    picks = [policy.choose(ranks((0, 0, 0), (0, 0, 0)), 500).rank for _ in range(4)]
    assert picks == [0, 1, 0, 1]  # exact ties rotate
    assert policy.choose(ranks((1, 2000, 0), (3, 1500, 0)), 500).rank == 1  # fewest tokens, not requests


def test_round_robin_and_least_load() -> None:
    rr = RoundRobin(CFG)
    assert [rr.choose(ranks((9, 9, 900), (0, 0, 0), (0, 0, 0)), 1000).rank for _ in range(4)] == [0, 1, 2, 0]
    assert rr.choose([RankLoad(0), RankLoad(2)], 10).rank == 2  # rank 1 is down: skipped
    ll = LeastLoad(CFG)
    assert ll.choose(ranks((1, 500, 900), (4, 400, 0)), 1000).rank == 1
    assert ll.choose(ranks((1, 500, 0), (0, 500, 0)), 1000).rank == 1  # same tokens: fewer requests
    assert make_policy(RouterConfig(policy="least_load")).name == "least_load"
    with pytest.raises(ValueError, match="unknown routing policy 'random'"):
        make_policy(RouterConfig(policy="random"))


def test_index_match_is_the_leading_run_of_cached_pages() -> None:
    index = RankCacheIndex(exact=True)
    index.apply(EventBatch(0.0, [BlockStored([1, 2, 3], None, [], 16, None, "GPU")], 0))
    assert index.match_pages([1, 2, 3, 4]) == 3
    assert index.match_pages([1, 9, 3]) == 1
    index.apply(EventBatch(0.0, [BlockRemoved([2], "GPU")], 0))
    assert index.match_pages([1, 2, 3]) == 1
    index.add_routed([7, 8])  # exact mode: only events change it
    assert index.match_pages([7]) == 0
    index.apply(EventBatch(0.0, [AllBlocksCleared()], 0))
    assert len(index) == 0


def test_approximate_index_forgets_least_recently_routed() -> None:
    index = RankCacheIndex(exact=False, capacity=4)
    index.add_routed([1, 2, 3])
    index.add_routed([10, 11])  # over capacity: page 1 (least recent) goes
    assert index.match_pages([1, 2]) == 0 and index.match_pages([10, 11]) == 2
    assert index.blocks() == {2, 3, 10, 11}
