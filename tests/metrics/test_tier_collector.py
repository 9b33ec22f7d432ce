"""The KV tier counters as Prometheus metrics (read from TierStats at scrape time)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from kvstrata.kv.tier_stats import TierStats
from kvstrata.metrics.tiers import TierCollector


def test_tier_counters_are_exposed_with_their_labels() -> None:
    stats = TierStats()
    registry = CollectorRegistry()
    registry.register(TierCollector(stats))
    stats.wrote("host", 3, 300)
    stats.read("host", 2, 200)
    stats.wrote("store", 4, 4096)
    stats.prefetch("started")
    stats.prefetch("timeouts")
    stats.error("redis", "read")
    stats.error("redis", "read")
    text = generate_latest(registry).decode()
    for line in (
        'kvstrata:kvstore_writes_total{tier="host"} 3.0',
        'kvstrata:kvstore_reads_total{tier="host"} 2.0',
        'kvstrata:kvstore_bytes_total{tier="host"} 500.0',
        'kvstrata:kvstore_writes_total{tier="store"} 4.0',
        'kvstrata:kvstore_reads_total{tier="store"} 0.0',
        "kvstrata:kvstore_prefetch_started_total 1.0",
        "kvstrata:kvstore_prefetch_completed_total 0.0",
        "kvstrata:kvstore_prefetch_timeouts_total 1.0",
        'kvstrata:kvstore_errors_total{backend="redis",kind="read"} 2.0',
    ):
        assert line in text.splitlines(), line
