"""`kvstrata bench trace --simulate`: our own cache code over a whole trace, with no model.

Each request, in trace order, goes through the engine's real KV path with a pool whose pages hold
one float each (layers = kv_heads = head_dim = 1), so only the bookkeeping costs anything:

    KVCacheManager.ready   -> KVTiers.prefetch_ready -> Prefetcher (real, its I/O thread) -> L3
    KVCacheManager.admit   -> RadixPrefixCache.match/lock (L1) -> HostTier (L2) -> CacheHit per tier
    KVCacheManager.allocate (evicts L1 LRU leaves -> on_evict -> HostTier.put_from_pool)
    "prefill": num_computed_tokens = prompt length
    KVCacheManager.release -> insert into L1 -> on_insert -> StoreWriter (real) -> L3, drained

L1 is the PagePool (`capacity.l1` tokens: the cache AND the running request's pages, as in the
server), L2 a HostTier of `l2` tokens, L3 an `LruCapStore` of `l3` tokens with the file store's
eviction (sim_store.py). Requests run one at a time, and only prompts are cached (generated
tokens never match a later prompt of the trace, so the server's pages of them only take room).

Two ways to lay a prompt onto pages (`mode`):
- "pad" (default): page size = block_tokens, every block (the last too) a whole page, plus one
  uncounted token after them. A cache holding every page then hits exactly the leading blocks some
  earlier request had, so hits are counted in the trace's tokens (a hit of k blocks is worth
  min(k * 512, input_length)) and at unbounded capacity the hit rate IS the trace's ideal, at any
  block size. The extra token is the one a real engine always computes (the radix cache never
  matches a prompt's last token: it needs its logits).
- "cut": the live prompts exactly (tokens.py), at the server's page size: the partial last
  page is never cached and the last token never hits, so this is what a cache of full pages can
  reach (counted in prompt tokens). The replay reports it as the slice's page-aware ideal; the
  server's tails (kv/tail_pages.py: a part page a finished request left, taken by the next prompt
  that goes on the same way) can take it past that.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from kvstrata.bench.trace.format import TraceRequest, leading_seen
from kvstrata.bench.trace.sim_store import UNBOUNDED, Capacity, LruCapStore
from kvstrata.bench.trace.tokens import TOKEN_LOW, BlockTokens
from kvstrata.config import CacheConfig
from kvstrata.engine.kv_manager import KVCacheManager
from kvstrata.engine.request import Request
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.kv.hashing import namespace_root
from kvstrata.kv.host_tier import HostTier
from kvstrata.kv.page_codec import PageCodec
from kvstrata.kv.page_io import page_shape
from kvstrata.kv.pool import PagePool
from kvstrata.kv.prefetcher import Prefetcher, PrefetchPolicy
from kvstrata.kv.radix import RadixPrefixCache
from kvstrata.kv.store.guard import GuardedStore
from kvstrata.kv.store_writer import StoreWriter
from kvstrata.kv.tier_stats import TierStats
from kvstrata.kv.tiers import KVTiers

MODES = ("pad", "cut")
TIERS = ("device", "host", "store")
_PARAMS = SamplingParams(max_tokens=1, temperature=0.0)
_IO_TIMEOUT_S = 600.0  # a simulation has no deadlines: prefetches and writes always finish


@dataclass
class SimResult:
    capacity: Capacity
    mode: str
    page_size: int
    requests: int = 0
    prompt_tokens: int = 0  # the denominator: trace tokens ("pad") or prompt tokens ("cut")
    hit_tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    seconds: float = 0.0

    def rate(self, tier: str | None = None) -> float:
        hits = sum(self.hit_tokens.values()) if tier is None else self.hit_tokens[tier]
        return hits / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "capacity": self.capacity.label(), "l1_tokens": _num(self.capacity.l1),
            "l2_tokens": _num(self.capacity.l2), "l3_tokens": _num(self.capacity.l3), "mode": self.mode,
            "page_size": self.page_size, "requests": self.requests, "prompt_tokens": self.prompt_tokens,
            "hit_tokens": dict(self.hit_tokens), "hit_rate": self.rate(),
            "hit_rate_by_tier": {t: self.rate(t) for t in TIERS}, "seconds": self.seconds,
        }


def _num(x: float) -> float | int | None:
    return None if x == UNBOUNDED else int(x)


class _Stack:
    """The engine's KV objects at one capacity, pages of one float."""

    def __init__(self, cap: Capacity, page_size: int, total_pages: int) -> None:
        def pages(tokens: float) -> int:
            return total_pages if tokens == UNBOUNDED else int(tokens) // page_size

        self.pool = PagePool(max(1, pages(cap.l1)), page_size, 1, 1, 1, torch.float32)
        root = namespace_root("kvstrata-trace-sim", "float32", page_size, "sim")
        self.cache = RadixPrefixCache(self.pool, page_size, root)
        self.tiers: KVTiers | None = None
        self.writer: StoreWriter | None = None
        if cap.l2 > 0:
            shape = page_shape(self.pool)
            host = HostTier(max(1, pages(cap.l2)), shape, torch.float32)
            stats = TierStats()
            prefetcher = None
            if cap.l3 > 0:
                store = GuardedStore(LruCapStore(UNBOUNDED if cap.l3 == UNBOUNDED else max(1, pages(cap.l3))),
                                     "sim", stats, call_timeout_s=_IO_TIMEOUT_S)
                codec = PageCodec(root, page_size, 1, 1, 1, "float32", host.page_bytes)
                self.writer = StoreWriter(store, codec)
                defaults = CacheConfig()
                policy = PrefetchPolicy(min_pages=defaults.kvstore_prefetch_min_pages, timeout_base_s=_IO_TIMEOUT_S,
                                        timeout_per_page_s=0.0, batch_pages=defaults.kvstore_prefetch_batch_pages,
                                        max_pages=max(1, host.capacity // 2))  # as build_tiers sizes it
                prefetcher = Prefetcher(store, codec, policy)
            self.tiers = KVTiers(self.cache, host, stats, self.writer, prefetcher)
        # full pages only: "cut" is the page-aligned ideal (the server's tails can go past it)
        self.manager = KVCacheManager(self.pool, self.cache, self.tiers, tails=False)

    def run(self, rid: str, tokens: list[int], computed: int) -> tuple[int, int, int]:
        """One request through the KV path, its first `computed` tokens cached after it; its hit
        (device, host, store) in tokens."""
        req = Request(rid, tokens, _PARAMS)
        mgr = self.manager
        while not mgr.ready(req):
            mgr.wait_for_io(1.0)
        hit = mgr.admit(req)
        need = len(tokens) - req.num_computed_tokens
        if not mgr.can_allocate(req, need):
            mgr.release(req)
            raise ValueError(f"L1 of {self.pool.num_pages} pages cannot hold request {rid} ({len(tokens)} tokens)")
        mgr.allocate(req, need)
        req.num_computed_tokens = computed
        mgr.release(req)
        if self.writer is not None:
            self.writer.drain(_IO_TIMEOUT_S)
        return hit.device, hit.host, hit.store

    def close(self) -> None:
        if self.tiers is not None:
            self.tiers.close(drain_timeout_s=_IO_TIMEOUT_S, flush=False)


def prompt_for(mapping: BlockTokens, req: TraceRequest, mode: str) -> list[int]:
    if mode == "pad":
        return mapping.full_blocks(req) + [TOKEN_LOW]
    return mapping.prompt(req)


def min_l1_tokens(requests: Sequence[TraceRequest], mapping: BlockTokens, mode: str, page_size: int) -> int:
    """The smallest L1 (tokens) that can run the longest request (the server needs it too)."""
    longest = max(len(prompt_for(mapping, r, mode)) for r in requests)
    return -(-longest // page_size) * page_size


def simulate(
    requests: Sequence[TraceRequest], mapping: BlockTokens, capacity: Capacity, mode: str = "pad",
    page_size: int | None = None, progress: Callable[[int], None] | None = None,
) -> SimResult:
    """Run every request through the cache stack at `capacity`; hit tokens per tier."""
    if mode not in MODES:
        raise ValueError(f"--partial-blocks must be one of {MODES}, got {mode!r}")
    ps = mapping.block_tokens if mode == "pad" or page_size is None else page_size
    if mode == "pad" and ps != mapping.block_tokens:
        raise ValueError("--partial-blocks pad simulates pages of exactly --block-tokens tokens")
    prompts = [prompt_for(mapping, r, mode) for r in requests]
    need = -(-max(len(p) for p in prompts) // ps) * ps
    if capacity.l1 < need:
        raise ValueError(f"--capacities {capacity.label()}: L1 must hold the longest request, >= {need} tokens")
    total_pages = sum(-(-len(p) // ps) for p in prompts) + 1
    result = SimResult(capacity, mode, ps)
    stack = _Stack(capacity, ps, total_pages)
    start = time.perf_counter()
    trace_block = mapping.trace_block
    try:
        for i, (req, tokens) in enumerate(zip(requests, prompts)):
            computed = len(tokens) - 1 if mode == "pad" else len(tokens)  # pad: the extra token is never cached
            device, host, store = stack.run(f"line{req.line}", tokens, computed)
            if mode == "pad":  # count in the trace's tokens: k leading blocks are worth min(k*512, L)
                n_in = req.input_length
                c1 = min(device // ps * trace_block, n_in)
                c2 = min((device + host) // ps * trace_block, n_in)
                c3 = min((device + host + store) // ps * trace_block, n_in)
                result.hit_tokens["device"] += c1
                result.hit_tokens["host"] += c2 - c1
                result.hit_tokens["store"] += c3 - c2
                result.prompt_tokens += n_in
            else:
                result.hit_tokens["device"] += device
                result.hit_tokens["host"] += host
                result.hit_tokens["store"] += store
                result.prompt_tokens += len(tokens)
            result.requests += 1
            if progress is not None:
                progress(i + 1)
    finally:
        stack.close()
    result.seconds = time.perf_counter() - start
    return result


def scaled_ideal(requests: Sequence[TraceRequest], mapping: BlockTokens) -> float:
    """The ideal in prompt tokens at this block size: sum(min(m * B, L')) / sum(L')."""
    lengths = [mapping.scaled_length(r.input_length) for r in requests]
    hits = sum(min(m * mapping.block_tokens, n) for m, n in zip(leading_seen(requests), lengths))
    return hits / sum(lengths)
