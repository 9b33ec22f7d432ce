"""build_tiers: KVTiers from the `--kvstore-*` flags, or None when there are no tiers beyond L1."""
from __future__ import annotations

import json
import logging
import math

import torch

from kvstrata.config import CacheConfig
from kvstrata.kv.host_tier import HostTier
from kvstrata.kv.page_codec import PageCodec
from kvstrata.kv.page_io import page_shape
from kvstrata.kv.prefetcher import Prefetcher, PrefetchPolicy
from kvstrata.kv.radix import RadixPrefixCache
from kvstrata.kv.store.guard import GuardedStore
from kvstrata.kv.store.registry import create_store
from kvstrata.kv.store_writer import StoreWriter
from kvstrata.kv.tier_stats import TierStats
from kvstrata.kv.tiers import KVTiers

logger = logging.getLogger(__name__)
# a store call that has not returned after this long is abandoned (GuardedStore); every backend takes
# "call_timeout_s" in --kvstore-storage-backend-extra-config to change it
DEFAULT_CALL_TIMEOUT_S = 10.0


def build_tiers(cfg: CacheConfig, cache: RadixPrefixCache | None) -> KVTiers | None:
    """L2 sized by --kvstore-size (GB) or --kvstore-ratio x L1; L3 from --kvstore-storage-backend.

    A bad flag raises ValueError; a store that cannot be reached at start is logged and counted,
    and the engine runs with L2 only (a store that is down costs hits, never the server)."""
    if cache is None or not cfg.enable_kvstore:
        return None
    pool = cache.pool
    shape = page_shape(pool)
    dtype = pool.k[0].dtype
    page_bytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if cfg.kvstore_size > 0:
        capacity = int(cfg.kvstore_size * 1e9) // page_bytes
    else:
        capacity = int(cfg.kvstore_ratio * pool.num_pages)
    if capacity <= 0:
        if cfg.kvstore_storage_backend:
            raise ValueError("--kvstore-storage-backend needs an L2: give --kvstore-ratio or --kvstore-size > 0")
        return None
    host = HostTier(capacity, shape, dtype, pin_memory=pool.k[0].device.type == "cuda", policy=cache.policy,
                    retention_quota=cfg.prompt_cache_retention_quota)
    stats = TierStats()
    writer = prefetcher = None
    backend = cfg.kvstore_storage_backend
    if backend:
        try:
            extra = json.loads(cfg.kvstore_storage_backend_extra_config or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"--kvstore-storage-backend-extra-config is not valid JSON: {exc}") from None
        if not isinstance(extra, dict):
            raise ValueError("--kvstore-storage-backend-extra-config must be a JSON object")
        call_timeout_s = _call_timeout(extra.pop("call_timeout_s", DEFAULT_CALL_TIMEOUT_S))
        try:
            store = create_store(backend, extra)
        except ValueError:
            raise
        except Exception as exc:  # noqa: BLE001 - unreachable store: run without L3
            stats.error(backend, "setup")
            logger.error("kvstore_unavailable backend=%s error=%r; running with L1+L2 only", backend, exc)
            store = None
        if store is not None:
            guarded = GuardedStore(store, backend, stats, call_timeout_s=call_timeout_s)
            dtype_name = str(dtype).removeprefix("torch.")
            codec = PageCodec(cache.root, shape[2], shape[1], shape[3], shape[4], dtype_name, page_bytes)
            writer = StoreWriter(guarded, codec)
            policy = PrefetchPolicy(
                min_pages=cfg.kvstore_prefetch_min_pages,
                timeout_base_s=cfg.kvstore_prefetch_timeout_base_s,
                timeout_per_page_s=cfg.kvstore_prefetch_timeout_per_page_s,
                batch_pages=cfg.kvstore_prefetch_batch_pages,
                max_pages=max(1, capacity // 2),
            )
            prefetcher = Prefetcher(guarded, codec, policy)
    logger.info(
        "kv_tiers l2_pages=%d l2_gb=%.2f l3=%s page_bytes=%d",
        capacity, capacity * page_bytes / 1e9, backend if writer is not None else "none", page_bytes,
    )
    return KVTiers(cache, host, stats, writer, prefetcher)


def _call_timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(
            f"--kvstore-storage-backend-extra-config call_timeout_s must be a positive number, got {value!r}"
        )
    return float(value)
