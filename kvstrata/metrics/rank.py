"""Prometheus metrics (prefix `kvstrata:`) and the per-request stats log line.

Observers run on the engine thread for every RequestOutput; gauges are read at scrape time.
Each server owns its registry, so several servers can live in one process (tests, DP ranks).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvstrata.engine.outputs import RequestOutput
from kvstrata.engine.sampling_params import RequestStats
from kvstrata.metrics import PREFIX as P
from kvstrata.metrics.classes import ClassCollector
from kvstrata.metrics.tiers import TierCollector

if TYPE_CHECKING:
    from kvstrata.engine.async_engine import AsyncEngine

stats_log = logging.getLogger("kvstrata.request_stats")

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.1, 0.25, 0.5, 1.0, 2.5)
SPEC_LENGTH_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# slack = target - what a request got, seconds: negative buckets are the misses, by how much
SLACK_BUCKETS = (-30.0, -10.0, -5.0, -2.0, -1.0, -0.5, -0.2, -0.1, -0.05, 0.0, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


@dataclass(frozen=True)
class LatencyTargets:
    """What a finished request is counted against (`--ttft-target-ms`, `--tpot-target-ms`), in seconds."""

    ttft_s: float = 2.0
    tpot_s: float = 0.2

    def slack(self, s: RequestStats) -> tuple[float | None, float | None]:
        """(TTFT slack, TPOT slack) of a finished request: target minus what it got; None where it has no
        such time (no token; one token has no time per output token)."""
        ttft = None if s.first_token is None else self.ttft_s - (s.first_token - s.arrival)
        tpot = s.tpot_s
        return ttft, None if tpot is None else self.tpot_s - tpot


class Metrics:
    def __init__(self, log_request_stats: bool = False, targets: LatencyTargets | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.log_request_stats = log_request_stats
        self.targets = targets or LatencyTargets()
        self.goodput = Counter(
            P + "request_goodput", "Finished requests that met both latency targets, or missed one", ["slo"],
            registry=r)
        for slo in ("met", "missed"):
            self.goodput.labels(slo=slo)
        self.ttft_slack = Histogram(
            P + "request_ttft_slack_seconds", "TTFT target minus a finished request's TTFT", buckets=SLACK_BUCKETS,
            registry=r)
        self.tpot_slack = Histogram(
            P + "request_tpot_slack_seconds", "TPOT target minus a finished request's mean time per output token",
            buckets=SLACK_BUCKETS, registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Generated tokens", registry=r)
        self.cache_queries = Counter(
            P + "prefix_cache_queries", "Prompt tokens looked up in the prefix cache", registry=r
        )
        self.cache_hits = Counter(
            P + "prefix_cache_hits", "Prompt tokens served from the prefix cache", ["tier"], registry=r
        )
        self.cache_hits.labels(tier="device")
        self.requests = Counter(
            P + "request_success", "Finished requests by finish reason", ["finish_reason"], registry=r
        )
        self.ttft = Histogram(
            P + "time_to_first_token_seconds", "Arrival to first token", buckets=LATENCY_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            P + "e2e_request_latency_seconds", "Arrival to finish", buckets=LATENCY_BUCKETS, registry=r
        )
        self.itl = Histogram(
            P + "inter_token_latency_seconds", "Time between output steps of a request", buckets=ITL_BUCKETS,
            registry=r,
        )
        self.running = Gauge(P + "num_requests_running", "Requests in the running batch", registry=r)
        self.waiting = Gauge(P + "num_requests_waiting", "Requests waiting for admission", registry=r)
        self.kv_usage = Gauge(P + "kv_cache_usage_perc", "Fraction of KV pages in use (0-1)", registry=r)
        self.cached_pages = Gauge(P + "prefix_cache_pages", "Pages held by the prefix cache", registry=r)
        # the response cache counts these (response_cache/service.py); entries is read at scrape time
        self.response_cache_hits = Counter(
            P + "response_cache_hits", "Requests answered from the response cache", registry=r
        )
        self.response_cache_misses = Counter(
            P + "response_cache_misses", "Cacheable requests the response cache sent to the model", registry=r
        )
        self.response_cache_evictions = Counter(
            P + "response_cache_evictions", "Keys the response cache evicted (LRU)", registry=r
        )
        self.response_cache_entries = Gauge(
            P + "response_cache_entries", "Keys holding results in the response cache", registry=r
        )
        # speculative decoding (engine/spec/): drafted and accepted tokens, and accepted tokens per verify step
        self.spec_drafted = Counter(P + "spec_decode_draft_tokens", "Drafted tokens verified", registry=r)
        self.spec_accepted = Counter(
            P + "spec_decode_accepted_tokens", "Drafted tokens the model agreed with (emitted without a step of their own)",
            registry=r)
        self.spec_accept_length = Histogram(
            P + "spec_decode_acceptance_length", "Drafted tokens accepted per verify step",
            buckets=SPEC_LENGTH_BUCKETS, registry=r)
        self._last_output: dict[str, float] = {}

    def bind(self, engine: AsyncEngine) -> None:
        """Read gauges from the engine at scrape time and observe its outputs."""
        eng = engine.engine
        pool = eng.pool
        self.running.set_function(lambda: eng.num_running)
        self.waiting.set_function(lambda: eng.num_waiting)
        self.kv_usage.set_function(lambda: pool.num_in_use / pool.num_pages)
        cache = eng.prefix_cache
        self.cached_pages.set_function(lambda: cache.num_cached_pages if cache is not None else 0)
        engine.on_output.append(self.observe)
        tiers = getattr(eng, "tiers", None)
        if cache is not None:  # pages and hits per eviction class (prompt_cache_retention, slru)
            self.registry.register(ClassCollector(cache, tiers.host if tiers is not None else None))
        if tiers is not None:  # L2/L3 counters, read at scrape time
            for tier in ("host", "store"):
                self.cache_hits.labels(tier=tier)
            self.registry.register(TierCollector(tiers.stats))

    def observe(self, out: RequestOutput) -> None:
        now = time.monotonic()
        rid = out.request_id
        if out.new_token_ids:
            last = self._last_output.get(rid)
            if last is not None:
                self.itl.observe(now - last)
            self._last_output[rid] = now
        if not out.finished:
            return
        self._last_output.pop(rid, None)
        s = out.stats
        self.prompt_tokens.inc(out.prompt_tokens)
        self.generation_tokens.inc(out.output_tokens)
        self.cache_queries.inc(out.prompt_tokens)
        for tier, n in s.tier_tokens.items():
            self.cache_hits.labels(tier=tier).inc(n)
        self.requests.labels(finish_reason=out.finish_reason or "unknown").inc()
        if s.spec is not None and s.spec.drafted:
            self.spec_drafted.inc(s.spec.drafted)
            self.spec_accepted.inc(s.spec.accepted)
            for length, steps in s.spec.accepted_lengths.items():
                for _ in range(steps):
                    self.spec_accept_length.observe(length)
        if s.first_token is not None:
            self.ttft.observe(s.first_token - s.arrival)
        if s.finished is not None:
            self.e2e.observe(s.finished - s.arrival)
        self._observe_slack(out)
        if self.log_request_stats:
            fields = s.as_log_fields(out.finish_reason)
            stats_log.info(
                "request_stats request_id=%s %s", rid, " ".join(f"{k}={v}" for k, v in fields.items())
            )

    def _observe_slack(self, out: RequestOutput) -> None:
        """Goodput and slack of a request that ended with tokens (stop or length): one that failed or was
        aborted is in request_success_total alone."""
        if out.finish_reason not in ("stop", "length"):
            return
        ttft, tpot = self.targets.slack(out.stats)
        for slack, histogram in ((ttft, self.ttft_slack), (tpot, self.tpot_slack)):
            if slack is not None:
                histogram.observe(slack)
        met = ttft is not None and ttft >= 0 and (tpot is None or tpot >= 0)
        self.goodput.labels(slo="met" if met else "missed").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
