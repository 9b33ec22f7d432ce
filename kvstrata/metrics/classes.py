"""Prometheus view of the eviction classes (kvstrata/kv/eviction_policy.py), read at scrape time.

    kvstrata:kv_class_pages{tier="device|host",class="probation|protected|retained"}   pages held
    kvstrata:kv_class_hits_total{tier="device|host",class=...}                          pages hit

A retained page is one a request sent with prompt_cache_retention "24h" (its class, not its age:
a page whose retention lapsed is counted retained in L1 until it is next touched).
"""
from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvstrata.kv.eviction_policy import CLASS_NAMES
from kvstrata.kv.host_tier import HostTier
from kvstrata.kv.radix import RadixPrefixCache
from kvstrata.metrics import PREFIX as P



class ClassCollector(Collector):
    def __init__(self, cache: RadixPrefixCache, host: HostTier | None) -> None:
        self.cache = cache
        self.host = host

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        pages = GaugeMetricFamily(P + "kv_class_pages", "KV pages held, by tier and eviction class",
                                  labels=["tier", "class"])
        hits = CounterMetricFamily(P + "kv_class_hits", "KV pages hit by admissions, by tier and eviction class",
                                   labels=["tier", "class"])
        tiers: list[tuple[str, object]] = [("device", self.cache)] + ([("host", self.host)] if self.host else [])
        for tier, holder in tiers:
            counts = holder.class_counts()  # type: ignore[attr-defined]
            hit_counts = list(holder.hits_by_class)  # type: ignore[attr-defined]
            for i, name in enumerate(CLASS_NAMES):
                pages.add_metric([tier, name], counts[i])
                hits.add_metric([tier, name], hit_counts[i])
        yield pages
        yield hits
