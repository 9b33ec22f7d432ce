"""Every Prometheus series kvstrata exposes (prefix `kvstrata:`), in one home.

A rank's `/metrics` (`rank.py`, one registry per server; gauges read at scrape time):
    prompt_tokens_total, generation_tokens_total                 tokens of finished requests
    prefix_cache_queries_total                                   prompt tokens looked up
    prefix_cache_hits_total{tier="device|host|store"}            prompt tokens served per KV tier
    request_success_total{finish_reason}                         finished requests
    time_to_first_token_seconds, e2e_request_latency_seconds,
    inter_token_latency_seconds                                  histograms
    request_goodput_total{slo="met|missed"}                      finished requests against both latency targets
    request_ttft_slack_seconds, request_tpot_slack_seconds       target minus what a request got (< 0: missed)
    num_requests_running, num_requests_waiting                   the batch and the queue
    kv_cache_usage_perc, prefix_cache_pages                      L1 pages in use, pages cached
    spec_decode_{draft,accepted}_tokens_total,
    spec_decode_acceptance_length                                speculative decoding (engine/spec/)
    response_cache_{hits,misses,evictions}_total,
    response_cache_entries                                       the response cache
    kvstore_{reads,writes,bytes}_total{tier}, kvstore_prefetch_{started,completed,timeouts}_total,
    kvstore_errors_total{backend,kind}                           L2/L3 traffic (`tiers.py`)
    kv_class_pages{tier,class}, kv_class_hits_total{tier,class}  eviction classes (`classes.py`)

The gateway's `/metrics` (`gateway.py`): every ready rank's series with a `rank` label, then
    router_requests_total{rank,policy}, router_decisions_total{reason}, router_match_ratio,
    router_overhead_seconds, router_retries_total{rank}

`tests/metrics/test_catalogue.py` checks this list against what the collectors expose.
"""
from prometheus_client.exposition import CONTENT_TYPE_LATEST

PREFIX = "kvstrata:"
CONTENT_TYPE = CONTENT_TYPE_LATEST  # the media type of a rank's and the gateway's /metrics body
