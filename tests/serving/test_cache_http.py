"""Prefix caching seen over HTTP: cached_tokens in usage (stream and not), /metrics, /flush_cache,
and the per-request stats log line."""
from __future__ import annotations

import logging
import re

import httpx
import openai
import pytest

from kvstrata.config_server import ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from serving_support import make_state, openai_client, serve

PROMPT = list(range(1000, 1100))  # 100 token ids: 6 full pages of 16, last token recomputed


def _metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name}{labels} not in /metrics"
    return float(m.group(1))


def test_cached_tokens_stream_and_not(client: openai.OpenAI, http: httpx.Client, model_name: str) -> None:
    http.post("/flush_cache").raise_for_status()
    first = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=4, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=4, temperature=0)
    # all but the last of the 100 tokens: 6 full pages, then the part page the first request left (a tail)
    assert again.usage.prompt_tokens_details.cached_tokens == 99
    assert again.choices[0].text == first.choices[0].text
    stream = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=4, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    usage = [c.usage for c in stream if c.usage is not None]
    assert usage and usage[-1].prompt_tokens_details.cached_tokens == 99


def test_flush_cache_empties_the_prefix_cache(client: openai.OpenAI, http: httpx.Client, model_name: str) -> None:
    client.completions.create(model=model_name, prompt=PROMPT, max_tokens=2, temperature=0)
    r = http.post("/flush_cache")
    assert r.status_code == 200 and r.json()["freed_pages"] > 0
    after = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=2, temperature=0)
    assert after.usage.prompt_tokens_details.cached_tokens == 0
    assert http.get("/flush_cache").status_code == 405


def test_metrics_count_tokens_and_hits(client: openai.OpenAI, http: httpx.Client, model_name: str) -> None:
    before = http.get("/metrics")
    assert before.status_code == 200 and before.headers["content-type"].startswith("text/plain")
    b = before.text
    client.completions.create(model=model_name, prompt=PROMPT, max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    client.completions.create(model=model_name, prompt=PROMPT, max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    a = http.get("/metrics").text
    assert _metric(a, "kvstrata:prompt_tokens_total") - _metric(b, "kvstrata:prompt_tokens_total") == 200
    assert _metric(a, "kvstrata:generation_tokens_total") - _metric(b, "kvstrata:generation_tokens_total") == 6
    assert _metric(a, "kvstrata:prefix_cache_queries_total") - _metric(b, "kvstrata:prefix_cache_queries_total") == 200
    hits = '{tier="device"}'
    assert _metric(a, "kvstrata:prefix_cache_hits_total", hits) - _metric(b, "kvstrata:prefix_cache_hits_total", hits) >= 96
    assert _metric(a, "kvstrata:time_to_first_token_seconds_count") - _metric(b, "kvstrata:time_to_first_token_seconds_count") == 2
    assert _metric(a, "kvstrata:e2e_request_latency_seconds_count") > 0
    assert _metric(a, "kvstrata:inter_token_latency_seconds_count") > 0
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert 0 <= _metric(a, f"kvstrata:{gauge}") <= 1 or gauge != "kv_cache_usage_perc"


def test_request_stats_log_line(engine: AsyncEngine, caplog: pytest.LogCaptureFixture) -> None:
    state = make_state(engine, ServerConfig(port=0, enable_log_request_stats=True))
    with serve(state) as srv, caplog.at_level(logging.INFO, logger="kvstrata.request_stats"):
        client = openai_client(srv)
        client.completions.create(model=engine.served_model_name, prompt=PROMPT, max_tokens=3, temperature=0)
    lines = [r.getMessage() for r in caplog.records if r.name == "kvstrata.request_stats"]
    assert lines, "no request_stats line logged"
    fields = dict(kv.split("=", 1) for kv in lines[-1].split()[1:])
    for key in ("prompt_tokens", "cache_tokens", "cache_hit_rate", "queue_ms", "prefill_ms", "ttft_ms",
                "total_ms", "decode_tps", "output_tokens", "finish_reason"):
        assert key in fields, key
    assert fields["prompt_tokens"] == "100"
