"""Eviction classes (kvstrata/kv/eviction_policy.py) in L1 (radix) and L2 (host tier): one-off pages
go before reused ones, retained pages survive other traffic within their quota and retention, and
the offline comparison (bench/scan_policy_sim.py) that picked `slru` over `lru`."""
from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest
import torch

from kvstrata.kv import eviction_policy as ep
from kvstrata.kv.hashing import namespace_root
from kvstrata.kv.host_tier import HostTier, HostTierIntegrityError
from kvstrata.kv.page_io import page_shape
from kvstrata.kv.pool import PagePool
from kvstrata.kv.radix import RadixPrefixCache

PS = 4
ROOT = namespace_root("m", "float32", PS, "test")
FAR = 4e12  # a retain_until far in the future (wall seconds)


def pool(n: int = 16) -> PagePool:
    return PagePool(n, PS, layers=1, kv_heads=1, head_dim=2, dtype=torch.float32)


def h(i: int) -> bytes:
    return i.to_bytes(32, "big")


def seq(start: int, pages: int) -> list[int]:
    return list(range(start, start + pages * PS))


def cache_with(policy: str) -> tuple[RadixPrefixCache, list[int], list[int]]:
    """Two cached 2-page prefixes: `reused` (inserted first, then hit) and `oneoff` (inserted last)."""
    p = pool()
    cache = RadixPrefixCache(p, PS, ROOT, policy)
    reused, oneoff = seq(100, 2), seq(500, 2)
    a, b = p.alloc(2), p.alloc(2)
    cache.insert(reused, a)
    cache.insert(oneoff, b)
    m = cache.match(reused + [0])
    cache.lock(m.node, hit=True)  # a later request reused it ...
    cache.unlock(m.node)
    cache.insert(oneoff, b)  # ... and the one-off prefix was touched after that
    return cache, a, b


def test_slru_evicts_one_off_pages_before_reused_ones_even_if_more_recent() -> None:
    cache, reused, oneoff = cache_with("slru")
    assert sorted(cache.evict(2).pages) == sorted(oneoff)
    cache.check_integrity()


def test_lru_evicts_by_recency_only() -> None:
    cache, reused, oneoff = cache_with("lru")
    assert sorted(cache.evict(2).pages) == sorted(reused)
    cache.check_integrity()


def test_retained_pages_go_last_in_l1_and_carry_their_class_to_the_evict_hook() -> None:
    p = pool()
    cache = RadixPrefixCache(p, PS, ROOT, "lru")
    kept, other = p.alloc(2), p.alloc(2)
    cache.insert(seq(100, 2), kept, cls=ep.RETAINED, retain_until=FAR)
    cache.insert(seq(500, 2), other)
    seen: list[list[tuple[int, float]]] = []
    cache.on_evict.append(lambda hashes, pages: seen.append(list(cache.evicting)))
    assert sorted(cache.evict(2).pages) == sorted(other)  # older, but retained
    assert sorted(cache.evict(2).pages) == sorted(kept) and seen[1] == [(ep.RETAINED, FAR)] * 2
    cache.check_integrity()


def test_expired_retention_orders_like_a_reused_page() -> None:
    assert ep.effective_class("slru", ep.RETAINED, 10.0, at=11.0) == ep.PROTECTED
    assert ep.effective_class("lru", ep.RETAINED, 10.0, at=11.0) == ep.PROBATION
    assert ep.effective_class("lru", ep.RETAINED, 12.0, at=11.0) == ep.RETAINED


def test_insert_class_of_a_request() -> None:
    assert ep.insert_class("slru", "in_memory", cached_tokens=90, prompt_tokens=100) == ep.PROTECTED
    assert ep.insert_class("slru", "in_memory", cached_tokens=16, prompt_tokens=1600) == ep.PROBATION
    assert ep.insert_class("lru", "in_memory", cached_tokens=90, prompt_tokens=100) == ep.PROBATION
    assert ep.insert_class("lru", "24h", cached_tokens=0, prompt_tokens=100) == ep.RETAINED


@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.5", True])
def test_bad_quota_and_policy_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="retention-quota"):
        ep.check_quota(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eviction-policy"):
        ep.check_policy("lfu")


def host(capacity: int, policy: str = "slru", quota: float = 0.5) -> tuple[HostTier, PagePool]:
    p = pool(capacity + 4)
    return HostTier(capacity, page_shape(p), torch.float32, policy=policy, retention_quota=quota), p


def put(tier: HostTier, p: PagePool, ids: list[int], cls: int, until: float = 0.0) -> None:
    tier.put_from_pool(p, [h(i) for i in ids], [0] * len(ids), [(cls, until)] * len(ids))


def test_l2_evicts_probation_before_protected() -> None:
    tier, p = host(5)
    put(tier, p, [1, 2], ep.PROTECTED)
    put(tier, p, [3, 4, 5], ep.PROBATION)
    put(tier, p, [6, 7, 8], ep.PROBATION)  # a scan: only the one-off pages make room
    assert tier.match([h(1), h(2)]) == 2 and not any(h(i) in tier for i in (3, 4, 5))
    tier.check_integrity()


def test_l2_protected_segment_is_capped_so_old_sessions_cannot_freeze_it() -> None:
    tier, p = host(5)  # protected cap: 4 pages
    put(tier, p, [1, 2, 3, 4, 5], ep.PROTECTED)
    assert tier.class_counts() == [1, 4, 0]  # the least recent protected page went back to probation
    put(tier, p, [6], ep.PROBATION)
    assert h(1) not in tier and h(2) in tier
    tier.check_integrity()


def test_retained_pages_survive_other_traffic_within_quota() -> None:
    tier, p = host(8, policy="lru", quota=0.5)  # 4 retained pages at most
    put(tier, p, [1, 2, 3], ep.RETAINED, FAR)
    put(tier, p, list(range(10, 40)), ep.PROBATION)  # a scan far larger than L2
    assert tier.match([h(1), h(2), h(3)]) == 3 and tier.class_counts()[ep.RETAINED] == 3
    put(tier, p, [4, 5], ep.RETAINED, FAR)  # over the quota: the oldest retained page is demoted
    assert tier.class_counts()[ep.RETAINED] == 4
    put(tier, p, list(range(40, 50)), ep.PROBATION)
    assert h(1) not in tier and all(h(i) in tier for i in (2, 3, 4, 5))
    tier.load_into_pool(p, [h(2)], p.alloc(1))
    assert tier.hits_by_class[ep.RETAINED] == 1
    tier.check_integrity()


def test_expired_retained_pages_become_ordinary() -> None:
    tier, p = host(4, policy="lru", quota=1.0)
    put(tier, p, [1, 2], ep.RETAINED, until=1.0)  # expired long ago
    put(tier, p, list(range(10, 14)), ep.PROBATION)
    assert h(1) not in tier and h(2) not in tier
    tier.check_integrity()


def test_zero_quota_keeps_nothing_retained_and_integrity_catches_a_broken_segment() -> None:
    tier, p = host(4, quota=0.0)
    put(tier, p, [1], ep.RETAINED, FAR)
    assert tier.class_counts() == [0, 1, 0]
    tier._segments[ep.PROBATION][h(99)] = 0.0  # corrupt it
    with pytest.raises(HostTierIntegrityError):
        tier.check_integrity()


def _sim() -> object:
    path = Path(__file__).resolve().parents[2] / "bench" / "scan_policy_sim.py"
    spec = importlib.util.spec_from_file_location("scan_policy_sim", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["scan_policy_sim"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_measured_pick_slru_survives_the_scan_where_lru_does_not() -> None:
    sim = _sim()
    kw = sim.WORKLOADS["scan"]  # type: ignore[attr-defined]
    eff = {}
    for policy in ("lru", "slru"):
        kv = sim.build(policy, 128, 128, quota=0.5)  # type: ignore[attr-defined]
        eff[policy] = sim.run(kv, sim.sessions(random.Random(0), retention="in_memory", **kw))  # type: ignore[attr-defined]
        kv.check_integrity([])
    assert eff["lru"] < 0.85 <= eff["slru"], eff
    kv = sim.build("lru", 128, 128, quota=0.5)  # type: ignore[attr-defined]
    assert sim.run(kv, sim.sessions(random.Random(0), retention="24h", **kw)) >= 0.95  # type: ignore[attr-defined]
