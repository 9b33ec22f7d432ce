"""Offline comparison of eviction policies on agent sessions under a scan (docs/kv-tiers.md, "Scan resistance").

Runs the real KVCacheManager, RadixPrefixCache, HostTier and KVTiers on a tiny page pool (no model:
a request's KV is never computed, only its pages move), one request at a time, on token-level
workloads shaped like `kvstrata bench agentic`:
- scan: S agent sessions (one shared system prompt) x T turns; between rounds of turns, P unique
  one-off prompts of L tokens (behind a 16-token shared template page) whose total exceeds L1+L2
  several times;
- agentic: the same sessions with no scan, more of them than the cache holds;
- multiround: many sessions with long private histories, round-robin, no scan.
Agent hit efficiency = sum of hit tokens / sum of achievable tokens (the longest page-aligned prefix
any earlier request computed, the last prompt token excluded), agent requests only.

Candidates: `lru` (today's order), `slru` (kvstrata/kv/eviction_policy.py: protected on hit, and
session continuations start protected), `slru-hit-only` (protected on hit only), `lru+doorkeeper`
(TinyLFU-style L2 admission: an L1 victim enters L2 only if its hash was seen evicted before).

    python bench/scan_policy_sim.py
"""
from __future__ import annotations

import random
from typing import Iterator

import torch

from kvstrata.engine.kv_manager import KVCacheManager
from kvstrata.engine.request import Request
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.kv import eviction_policy as ep
from kvstrata.kv.hashing import namespace_root
from kvstrata.kv.host_tier import HostTier
from kvstrata.kv.page_io import page_shape
from kvstrata.kv.pool import PagePool
from kvstrata.kv.radix import RadixPrefixCache
from kvstrata.kv.tier_stats import TierStats
from kvstrata.kv.tiers import KVTiers

PS = 16
TEMPLATE = list(range(1, PS + 1))  # the chat template's shared head: one page every prompt shares


class Doorkeeper(HostTier):
    """TinyLFU-style admission: L2 admits an L1 victim only if its hash was evicted once before."""

    seen: set[bytes]

    def put_from_pool(self, pool, hashes, pages, classes=None):  # type: ignore[no-untyped-def,override]
        seen = self.__dict__.setdefault("seen", set())
        keep = [i for i, h in enumerate(hashes) if h in seen or h in self]
        seen.update(hashes)
        return super().put_from_pool(pool, [hashes[i] for i in keep], [pages[i] for i in keep],
                                     [classes[i] for i in keep] if classes else None)


class Ledger:
    def __init__(self) -> None:
        self.nodes: dict[tuple[int, tuple[int, ...]], int] = {}

    def add(self, tokens: list[int]) -> None:
        parent = 0
        for s in range(0, len(tokens) - PS + 1, PS):
            parent = self.nodes.setdefault((parent, tuple(tokens[s : s + PS])), len(self.nodes) + 1)

    def match(self, tokens: list[int]) -> int:
        parent = n = 0
        while n + PS <= len(tokens) - 1 and (parent := self.nodes.get((parent, tuple(tokens[n : n + PS])), 0)):
            n += PS
        return n


def build(policy: str, l1_pages: int, l2_pages: int, quota: float) -> KVCacheManager:
    pool = PagePool(l1_pages, PS, 1, 1, 2, torch.float32)
    name = "lru" if policy.startswith("lru") else "slru"
    cache = RadixPrefixCache(pool, PS, namespace_root("sim", "float32", PS, "sim"), name)
    cls = Doorkeeper if policy == "lru+doorkeeper" else HostTier
    host = cls(l2_pages, page_shape(pool), torch.float32, policy=name, retention_quota=quota)
    return KVCacheManager(pool, cache, KVTiers(cache, host, TierStats()))


def run(kv: KVCacheManager, stream: Iterator[tuple[str, list[int], int, str]]) -> float:
    """Feed (kind, prompt, reply_len, retention) requests; agent hit efficiency."""
    ledger, hit_sum, ach_sum, n = Ledger(), 0, 0, 0
    for kind, prompt, reply_len, retention in stream:
        n += 1
        req = Request(f"r{n}", list(prompt), SamplingParams(max_tokens=reply_len, retention=retention))
        achievable = ledger.match(req.token_ids)
        hit = kv.admit(req)
        req.stats.cached_tokens = hit.tokens
        kv.allocate(req, len(prompt) + reply_len - hit.tokens)
        req.token_ids += [random.randrange(50_000, 60_000) for _ in range(reply_len)]
        req.num_computed_tokens = len(req.token_ids) - 1  # the last sampled token is never fed back
        kv.release(req)
        ledger.add(req.token_ids[:-1])
        if kind == "agent":
            hit_sum += hit.tokens
            ach_sum += achievable
    return hit_sum / ach_sum if ach_sum else 1.0


def sessions(rng: random.Random, n: int, turns: int, system: int, user: int, reply: int, retention: str,
             scan: int = 0, scan_tokens: int = 0, private_system: bool = False) -> Iterator[tuple[str, list[int], int, str]]:
    shared = TEMPLATE + [rng.randrange(1000, 50_000) for _ in range(system)]
    history = [list(shared) if not private_system else TEMPLATE + [rng.randrange(1000, 50_000) for _ in range(system)]
               for _ in range(n)]
    for _ in range(turns):
        for s in range(n):
            history[s] += [rng.randrange(1000, 50_000) for _ in range(user)]
            yield "agent", list(history[s]), reply, retention
            history[s] += [rng.randrange(60_000, 70_000) for _ in range(reply)]  # the reply, as re-sent
        for _ in range(scan):
            yield "scan", TEMPLATE + [rng.randrange(1000, 50_000) for _ in range(scan_tokens)], 8, "in_memory"


WORKLOADS = {  # name -> (sessions args); L1 = 128 pages (2048 tokens), L2 = 128 pages (--kvstore-ratio 1)
    "scan": dict(n=3, turns=4, system=800, user=60, reply=32, scan=5, scan_tokens=1600),
    "agentic (no scan)": dict(n=8, turns=5, system=1000, user=80, reply=32),
    "multiround (no scan)": dict(n=6, turns=5, system=400, user=120, reply=64, private_system=True),
}


def main() -> None:
    rows = []
    for name, kw in WORKLOADS.items():
        for retention in (("in_memory", "24h") if name == "scan" else ("in_memory",)):
            for policy in ("lru", "slru", "slru-hit-only", "lru+doorkeeper"):
                saved = ep.CONTINUATION_SHARE
                ep.CONTINUATION_SHARE = 2.0 if policy == "slru-hit-only" else saved  # never a continuation
                try:
                    kv = build(policy, 128, 128, quota=0.5)
                    eff = run(kv, sessions(random.Random(0), retention=retention, **kw))
                    kv.check_integrity([])
                finally:
                    ep.CONTINUATION_SHARE = saved
                rows.append((name, retention, policy, eff))
    print(f"{'workload':22} {'retention':10} {'policy':16} agent hit efficiency")
    for name, retention, policy, eff in rows:
        print(f"{name:22} {retention:10} {policy:16} {eff:.3f}")


if __name__ == "__main__":
    main()
