"""KeyAffinity: a prompt_cache_key sticks to one rank, moves (and stays moved) only when that rank is
past the balance thresholds, never crosses tenants, and the map stays bounded."""
from __future__ import annotations

from kvstrata.config_server import RouterConfig
from kvstrata.router.key_affinity import SESSION_ACTIVE_S, KeyAffinity, affinity_key
from kvstrata.router.policy import Decision, RankLoad

CFG = RouterConfig(balance_abs_threshold=4, balance_rel_threshold=1.5)


def loads(*requests: int) -> list[RankLoad]:
    return [RankLoad(rank=i, requests=n) for i, n in enumerate(requests)]


def test_key_sticks_until_its_rank_is_overloaded_then_stays_moved() -> None:
    aff = KeyAffinity(CFG)
    key = affinity_key({"prompt_cache_key": "s1"}, {})
    assert key is not None
    assert aff.route(key, loads(0, 0), Decision(1, "cache_miss")).rank == 1
    # the policy would pick rank 0 now, but the key stays on 1 while 1 is within the thresholds
    for busy in (1, 3, 4):
        d = aff.route(key, loads(0, busy), Decision(0, "cache_miss"))
        assert (d.rank, d.reason) == (1, "session"), busy
    assert aff.moves == 0
    # 5 - 0 > 4 and 5 > 0 * 1.5: past both thresholds, the key moves to the policy's pick
    d = aff.route(key, loads(0, 5), Decision(0, "imbalanced"))
    assert (d.rank, d.reason, aff.moves) == (0, "session_moved", 1)
    # and stays moved, even once rank 1 is idle again
    assert aff.route(key, loads(0, 0), Decision(1, "cache_miss")).rank == 0


def test_relative_threshold_keeps_a_key_on_a_busy_but_proportionate_rank() -> None:
    aff = KeyAffinity(CFG)
    key = affinity_key({"prompt_cache_key": "s"}, {})
    aff.route(key, loads(0, 0), Decision(1, "cache_miss"))
    assert aff.route(key, loads(10, 14), Decision(0, "cache_miss")).rank == 1  # 14 <= 10 * 1.5


def test_by_cost_a_session_stays_while_its_rank_is_not_dearer() -> None:
    """With the cost policy a session keeps its rank while it costs no more than the policy's pick: its
    history (taken to be cached there, whatever the index says yet) against a queue."""
    from kvstrata.router.policy import CostAware

    policy = CostAware(CFG)
    aff = KeyAffinity(CFG)
    key = affinity_key({"prompt_cache_key": "s"}, {})
    aff.route(key, [RankLoad(0), RankLoad(1)], Decision(0, "cost"))

    def route(queued0: int) -> Decision:
        here = [RankLoad(0, 1, 0, 900, queued0), RankLoad(1, 0, 0, 0, 0)]
        return aff.route(key, here, policy.choose(here, 1000), 1000, lambda r: policy.cost(r, 1000))

    assert (route(800).rank, route(800).reason) == (0, "session")  # 800 + 32 <= 1000
    # the index shows nothing of the session on its rank yet (KV events lag a turn): busier, it still stays
    lagging = [RankLoad(0, 3, 0, 0, 0), RankLoad(1, 0, 0, 0, 0)]
    assert aff.route(key, lagging, policy.choose(lagging, 1000), 1000, lambda r: policy.cost(r, 1000)).rank == 0
    d = route(2000)  # queued past the history's recompute: moves
    assert (d.rank, d.reason, aff.moves) == (1, "session_moved", 1)


def test_hard_affinity_stays_on_a_ready_rank_whatever_its_load() -> None:
    aff = KeyAffinity(RouterConfig(session_affinity="hard", balance_abs_threshold=4))
    key = affinity_key({"prompt_cache_key": "s"}, {})
    aff.route(key, loads(0, 0), Decision(1, "cache_miss"))
    assert aff.route(key, loads(0, 500), Decision(0, "imbalanced")).rank == 1
    assert aff.route(key, [RankLoad(0)], Decision(0, "cache_miss")).rank == 0  # rank 1 down: moves


def test_unready_rank_moves_the_key() -> None:
    aff = KeyAffinity(CFG)
    key = affinity_key({"prompt_cache_key": "s"}, {})
    aff.route(key, loads(0, 0, 0), Decision(2, "cache_miss"))
    ready = [RankLoad(0), RankLoad(1)]  # rank 2 is down
    assert aff.route(key, ready, Decision(0, "cache_miss")).rank == 0 and aff.moves == 1


def test_keys_are_namespaced_by_api_key_and_cache_salt() -> None:
    base = affinity_key({"prompt_cache_key": "s"}, {"authorization": "Bearer a"})
    assert base == affinity_key({"prompt_cache_key": "s", "model": "m"}, {"authorization": "Bearer a"})
    assert base != affinity_key({"prompt_cache_key": "s"}, {"authorization": "Bearer b"})
    assert base != affinity_key({"prompt_cache_key": "s", "cache_salt": "x"}, {"authorization": "Bearer a"})
    # no length-prefix confusion between the parts
    assert affinity_key({"prompt_cache_key": "b", "cache_salt": "a"}, {}) != affinity_key({"prompt_cache_key": "", "cache_salt": "ab"}, {})
    for body in ({}, {"prompt_cache_key": None}, {"prompt_cache_key": 5}, {"user": ""}, {"user": 5}):
        assert affinity_key(body, {}) is None
    # OpenAI's `user` is a session of last resort, never the same key as a prompt_cache_key of that text
    assert affinity_key({"user": "u1"}, {}) not in (None, affinity_key({"prompt_cache_key": "u1"}, {}))
    assert affinity_key({"user": "u1", "prompt_cache_key": "k"}, {}) == affinity_key({"prompt_cache_key": "k"}, {})


def test_tenants_with_the_same_key_are_routed_independently() -> None:
    aff = KeyAffinity(CFG)
    a = affinity_key({"prompt_cache_key": "s"}, {"authorization": "Bearer a"})
    b = affinity_key({"prompt_cache_key": "s"}, {"authorization": "Bearer b"})
    aff.route(a, loads(0, 0), Decision(0, "cache_miss"))
    assert aff.route(b, loads(0, 0), Decision(1, "cache_miss")).rank == 1
    assert aff.route(a, loads(0, 0), Decision(1, "cache_miss")).rank == 0  # a keeps its own rank


def test_map_is_bounded_lru() -> None:
    aff = KeyAffinity(CFG, max_keys=3)
    keys = [affinity_key({"prompt_cache_key": str(i)}, {}) for i in range(5)]
    for i, k in enumerate(keys[:3]):
        aff.route(k, loads(0, 0), Decision(i % 2, "cache_miss"))
    aff.route(keys[0], loads(0, 0), Decision(1, "cache_miss"))  # refresh key 0
    aff.route(keys[3], loads(0, 0), Decision(0, "cache_miss"))
    assert len(aff) == 3
    # key 1 (rank 1) was the least recently used: forgotten, so it goes where the policy says
    assert aff.route(keys[1], loads(0, 0), Decision(0, "cache_miss")) == Decision(0, "cache_miss", 0.0)
    # key 0 was refreshed: still on rank 0, though the policy says 1
    assert aff.route(keys[0], loads(0, 0), Decision(1, "cache_miss")).reason == "session"


def test_claude_codes_session_is_the_key() -> None:
    header = affinity_key({}, {"x-claude-code-session-id": "s1", "x-api-key": "a"})
    meta = affinity_key({"metadata": {"user_id": '{"session_id": "s1"}'}}, {"x-api-key": "a"})
    assert header is not None and header == meta
    assert header != affinity_key({}, {"x-claude-code-session-id": "s1", "x-api-key": "b"})  # another tenant's
    assert affinity_key({"metadata": "s1"}, {}) is None


def test_active_sessions_counts_recent_keys_per_rank_leaving_the_asker_out() -> None:
    aff = KeyAffinity(CFG)
    keys = [bytes([i]) * 32 for i in range(5)]
    for i, key in enumerate(keys):  # keys 0-2 on rank 0, 3-4 on rank 1, one second apart
        aff.route(key, loads(0, 0), Decision(0 if i < 3 else 1, "cost"), now=100.0 + i)
    assert aff.active_sessions(104.0) == {0: 3, 1: 2}
    assert aff.active_sessions(104.0, exclude=keys[4]) == {0: 3, 1: 1}
    # keys quiet for longer than SESSION_ACTIVE_S are no one's load; a new request makes a key count again
    assert aff.active_sessions(102.5 + SESSION_ACTIVE_S) == {1: 2}
    aff.route(keys[0], loads(0, 0), Decision(1, "cost"), now=103.0 + SESSION_ACTIVE_S)  # stays on rank 0
    assert aff.active_sessions(103.5 + SESSION_ACTIVE_S) == {0: 1, 1: 1}  # key 3 (seen at 103) gone too
