"""Prometheus view of the KV tiers' counters (`kvstrata/kv/tier_stats.py`), read at scrape time.

    kvstrata:kvstore_{reads,writes,bytes}_total{tier="host|store"}   pages / bytes through L2, L3
    kvstrata:kvstore_prefetch_{started,completed,timeouts}_total      L3 prefetches before admission
    kvstrata:kvstore_errors_total{backend,kind}                       store failures and bad values
"""
from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from kvstrata.kv.tier_stats import TierStats
from kvstrata.metrics import PREFIX as P

TIERS = ("host", "store")


class TierCollector(Collector):
    def __init__(self, stats: TierStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        snap = self.stats.snapshot()
        for name, values, doc in (
            ("kvstore_reads", snap.reads, "KV pages read from a tier beyond L1"),
            ("kvstore_writes", snap.writes, "KV pages written to a tier beyond L1"),
            ("kvstore_bytes", snap.bytes, "Bytes read from and written to a tier beyond L1"),
        ):
            family = CounterMetricFamily(P + name, doc, labels=["tier"])
            for tier in TIERS:
                family.add_metric([tier], values.get(tier, 0))
            yield family
        for event in ("started", "completed", "timeouts"):
            yield CounterMetricFamily(
                P + f"kvstore_prefetch_{event}", f"L3 prefetches before admission: {event}",
                value=snap.prefetch.get(event, 0),
            )
        errors = CounterMetricFamily(P + "kvstore_errors", "KV store failures and rejected values", labels=["backend", "kind"])
        for (backend, kind), n in sorted(snap.errors.items()):
            errors.add_metric([backend, kind], n)
        yield errors
