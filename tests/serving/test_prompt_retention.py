"""prompt_cache_retention "24h" end to end: a real server with L2 and a real redis-server L3. The
request's pages are counted retained in /metrics (pages and hits per class) and written to Redis
with a 24-hour TTL; other requests' pages keep the store's default (no TTL)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from kvstrata.config import CacheConfig, ModelConfig
from kvstrata.engine.async_engine import AsyncEngine
from serving_support import SCHED, make_state, serve
from store_servers import redis_server

DAY_MS = 24 * 3600 * 1000


@pytest.fixture()
def redis_url() -> Iterator[str]:
    with redis_server() as server:
        yield server.url


def metric(text: str, name: str, **labels: str) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError((name, labels))


def test_24h_pages_are_retained_counted_and_written_with_a_day_ttl(model_cfg: ModelConfig, redis_url: str) -> None:
    cache = CacheConfig(max_total_tokens=1024, page_size=16, kvstore_ratio=1.0, kvstore_storage_backend="redis",
                        kvstore_storage_backend_extra_config=json.dumps({"url": redis_url}))
    engine = AsyncEngine.from_config(model_cfg, cache, SCHED)
    writer = engine.engine.tiers.writer if engine.engine.tiers is not None else None
    assert writer is not None
    r = redis.Redis.from_url(redis_url)
    try:
        with serve(make_state(engine)) as srv, httpx.Client(base_url=srv.base_url, timeout=60) as http:
            def chat(text: str, **hints: str) -> None:
                body = {"messages": [{"role": "user", "content": text}], "max_tokens": 1, **hints}
                assert http.post("/v1/chat/completions", json=body).status_code == 200

            chat("retained " + "alpha beta gamma " * 60, prompt_cache_key="s1", prompt_cache_retention="24h")
            assert writer.drain(30.0)  # every page written (a request's pages come in several batches)
            assert len(r.keys("*")) >= 8
            retained_keys = set(r.keys("*"))
            chat("ordinary " + "delta epsilon zeta " * 60)
            assert writer.drain(30.0)
            assert len(r.keys("*")) >= len(retained_keys) + 8
            ttls = {k: r.pttl(k) for k in r.keys("*")}
            new = [t for k, t in ttls.items() if k not in retained_keys]
            old = [ttls[k] for k in retained_keys]
            assert all(DAY_MS - 600_000 < t <= DAY_MS for t in old), old  # a day, less the test's time
            assert new and all(t == -1 for t in new), new  # the store's default: no expiry
            chat("retained " + "alpha beta gamma " * 60, prompt_cache_retention="24h")  # hits its pages
            text = http.get("/metrics").text
            assert metric(text, "kvstrata:kv_class_pages", tier="device", **{"class": "retained"}) >= 8
            assert metric(text, "kvstrata:kv_class_hits_total", tier="device", **{"class": "retained"}) >= 8
            assert metric(text, "kvstrata:kv_class_pages", tier="host", **{"class": "retained"}) == 0
    finally:
        engine.shutdown()
        r.close()
