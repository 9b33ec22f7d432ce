"""The gateway's own Prometheus series, and every rank's series relabelled with `rank`.

`/metrics` on the gateway = each ready rank's `/metrics`, every sample given a `rank` label and
merged family by family, followed by the router's series:
- `kvstrata:router_requests_total{rank,policy}` (policy "pinned" for `data_parallel_rank`),
- `kvstrata:router_decisions_total{reason}` (why: cost, session (a session kept on its rank), session_moved,
  pinned, previous_response, cache_match, cache_miss, imbalanced, least_load, round_robin, retry),
- `kvstrata:router_match_ratio` (histogram: cached share of the prompt on the chosen rank),
- `kvstrata:router_overhead_seconds` (histogram: request in -> upstream send: parse, tokenize, route),
- `kvstrata:router_retries_total{rank}` (requests moved off a failed rank before any byte went out).
"""
from __future__ import annotations

import collections
import statistics
from typing import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from kvstrata.metrics import PREFIX as P

RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(P + "router_requests", "Requests sent to each rank", ["rank", "policy"], registry=r)
        self.decisions = Counter(P + "router_decisions", "Routing decisions by reason", ["reason"], registry=r)
        self.match_ratio = Histogram(
            P + "router_match_ratio", "Cached share of the prompt on the chosen rank", buckets=RATIO_BUCKETS, registry=r
        )
        self.overhead = Histogram(
            P + "router_overhead_seconds", "Gateway time from request in to upstream send (parse, tokenize, route)",
            buckets=OVERHEAD_BUCKETS, registry=r,
        )
        self.retries = Counter(
            P + "router_retries", "Requests moved off a failed rank before any byte reached the client", ["rank"],
            registry=r,
        )
        self._overhead_ms: collections.deque[float] = collections.deque(maxlen=10_000)

    def routed(self, rank: int, policy: str, match_ratio: float | None, overhead_s: float, reason: str = "") -> None:
        self.requests.labels(rank=str(rank), policy=policy).inc()
        if reason:
            self.decisions.labels(reason=reason).inc()
        if match_ratio is not None:
            self.match_ratio.observe(match_ratio)
        self.overhead.observe(overhead_s)
        self._overhead_ms.append(overhead_s * 1000)

    def overhead_ms(self) -> dict[str, float | int]:
        """p50/p90 of the recent per-request gateway overhead, exact (not bucketed)."""
        samples = sorted(self._overhead_ms)
        if not samples:
            return {"count": 0}
        q = statistics.quantiles(samples, n=10) if len(samples) > 1 else [samples[0]] * 9
        return {"count": len(samples), "p50": round(statistics.median(samples), 3), "p90": round(q[8], 3)}

    def render(self, rank_texts: dict[int, str]) -> bytes:
        return merge_rank_metrics(rank_texts) + generate_latest(self.registry)


class _Families:
    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


def merge_rank_metrics(rank_texts: dict[int, str]) -> bytes:
    """Every rank's exposition text as one, each sample labelled with its rank."""
    merged: dict[str, Metric] = {}
    for rank, text in sorted(rank_texts.items()):
        for fam in text_string_to_metric_families(text):
            out = merged.get(fam.name)
            if out is None:
                out = merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            out.samples.extend(s._replace(labels={**s.labels, "rank": str(rank)}) for s in fam.samples)
    registry = CollectorRegistry()
    registry.register(_Families(merged.values()))  # type: ignore[arg-type]
    return generate_latest(registry)
