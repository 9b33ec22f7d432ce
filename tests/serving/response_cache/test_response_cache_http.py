"""The response cache over HTTP, on the real server and engine with the real openai client:
hit/miss/bypass headers, usage of a hit, streamed replay, aborted streams, opt-outs, single
flight, list-size rules, fixed keys under pressure, /response_cache, its flush and /metrics."""
from __future__ import annotations

import asyncio
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import httpx
import openai
import pytest

from kvstrata.config_server import ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.engine.outputs import RequestOutput
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.serving.server import ServerThread
from serving_support import RecordingEngine, assert_error, make_state, openai_client, serve

HEADER = "x-kvstrata-cache"
FIXED = {"prompt": "Question: What is the longest river on the earth? Answer:", "max_tokens": 4, "temperature": 0}


class CountingEngine(RecordingEngine):
    """Records every generate() call in `started`; `delay_s` holds each one back before it starts."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.started: list[str] = []
        self.delay_s = 0.0

    async def generate(self, request_id: str, ids: list[int], params: SamplingParams) -> AsyncIterator[RequestOutput]:
        self.started.append(request_id)
        await asyncio.sleep(self.delay_s)
        async with aclosing(super().generate(request_id, ids, params)) as outs:
            async for out in outs:
                yield out


@pytest.fixture(scope="module")
def rec(engine: AsyncEngine) -> CountingEngine:
    return CountingEngine(engine)


@pytest.fixture(scope="module")
def cached_server(rec: CountingEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    fixed = tmp_path_factory.mktemp("response-cache") / "fixed.jsonl"
    fixed.write_text(json.dumps(FIXED) + "\n")
    cfg = ServerConfig(port=0, response_cache_size=4, response_cache_list_size=2, response_cache_fixed_keys=str(fixed))
    with serve(make_state(rec, cfg)) as srv:
        yield srv


@pytest.fixture()
def cc(cached_server: ServerThread) -> openai.OpenAI:
    return openai_client(cached_server)


@pytest.fixture()
def ch(cached_server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cached_server.base_url, timeout=30) as c:
        c.post("/response_cache/flush").raise_for_status()
        yield c


def complete(client: openai.OpenAI, **kw: Any) -> tuple[str, Any]:
    raw = client.completions.with_raw_response.create(**kw)
    return raw.headers[HEADER], raw.parse()


def test_miss_then_hit_answers_without_the_engine(cc: openai.OpenAI, ch: httpx.Client, rec: CountingEngine,
                                                   model_name: str) -> None:
    kw: dict[str, Any] = {"model": model_name, "prompt": "The river", "max_tokens": 6, "temperature": 0,
                          "extra_body": {"ignore_eos": True}}
    before = len(rec.started)
    status, miss = complete(cc, **kw)
    assert status == "miss"
    status, hit = complete(cc, **kw)
    assert status == "hit" and len(rec.started) == before + 1
    assert hit.choices[0].text == miss.choices[0].text and hit.choices[0].finish_reason == "length"
    assert hit.id != miss.id and hit.object == "text_completion"
    assert (hit.usage.prompt_tokens, hit.usage.completion_tokens) == (miss.usage.prompt_tokens, 6)
    assert hit.usage.prompt_tokens_details.cached_tokens == hit.usage.prompt_tokens
    assert complete(cc, **kw, user="someone else")[0] == "hit"  # not an output-affecting field
    assert complete(cc, **{**kw, "max_tokens": 7})[0] == "miss"


def test_streamed_hit_replays_the_same_text_and_shape(cc: openai.OpenAI, ch: httpx.Client, rec: CountingEngine,
                                                      model_name: str) -> None:
    kw: dict[str, Any] = {"model": model_name, "messages": [{"role": "user", "content": "tell me"}], "max_tokens": 8,
                          "temperature": 0, "extra_body": {"ignore_eos": True}}
    before = len(rec.started)
    live_raw = cc.chat.completions.with_raw_response.create(stream=True, stream_options={"include_usage": True}, **kw)
    assert live_raw.headers[HEADER] == "miss"
    live = list(live_raw.parse())
    hit_raw = cc.chat.completions.with_raw_response.create(stream=True, stream_options={"include_usage": True}, **kw)
    assert hit_raw.headers[HEADER] == "hit"
    replayed = list(hit_raw.parse())

    def text(chunks: list[Any]) -> str:
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    assert text(live) and text(replayed) == text(live)
    assert replayed[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == replayed[0].id for c in replayed)
    assert [c.choices[0].finish_reason for c in replayed if c.choices][-1] == "length"
    usage, live_usage = replayed[-1].usage, live[-1].usage
    assert replayed[-1].choices == [] and usage is not None and live_usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (live_usage.prompt_tokens, live_usage.completion_tokens)
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens
    full = cc.chat.completions.with_raw_response.create(**kw)  # the streamed result serves plain requests too
    assert full.headers[HEADER] == "hit" and full.parse().choices[0].message.content == text(live)
    assert len(rec.started) == before + 1


def test_an_aborted_stream_is_not_kept(ch: httpx.Client, rec: CountingEngine, model_name: str) -> None:
    body = {"model": model_name, "prompt": "a long one", "max_tokens": 1500, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with ch.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.headers[HEADER] == "miss"
        next(resp.iter_lines())
    rid = rec.started[-1]
    deadline = time.monotonic() + 10
    while rec.ended.get(rid) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert rec.ended.get(rid) == "closed"
    assert ch.get("/response_cache").json()["entries"] == 0
    with ch.stream("POST", "/v1/completions", json=body, timeout=5) as resp:  # its slot was released too
        assert resp.headers[HEADER] == "miss"


def test_opt_outs_bypass_the_cache(cc: openai.OpenAI, ch: httpx.Client, rec: CountingEngine, model_name: str,
                                   client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": model_name, "prompt": "opt out", "max_tokens": 3, "temperature": 0}
    assert [complete(cc, **kw)[0] for _ in range(2)] == ["miss", "hit"]
    before = len(rec.started)
    assert complete(cc, **kw, extra_body={"cache": False})[0] == "bypass"
    assert complete(cc, **kw, extra_headers={"Cache-Control": "no-cache"})[0] == "bypass"
    assert len(rec.started) == before + 2
    assert_error(ch.post("/v1/completions", json={**kw, "cache": "no"}), 400, param="cache")
    assert complete(client, **kw)[0] == "bypass"  # the default server: the cache is off


def test_concurrent_identical_misses_run_one_generation(cc: openai.OpenAI, ch: httpx.Client, rec: CountingEngine,
                                                        model_name: str) -> None:
    def burst(**kw: Any) -> tuple[int, list[str], list[str]]:
        before = len(rec.started)
        rec.delay_s = 0.3  # every request arrives while the first generation is still running
        try:
            with ThreadPoolExecutor(8) as pool:
                out = list(pool.map(lambda _: complete(cc, model=model_name, max_tokens=5, **kw), range(8)))
        finally:
            rec.delay_s = 0.0
        return len(rec.started) - before, sorted(s for s, _ in out), [r.choices[0].text for _, r in out]

    runs, statuses, texts = burst(prompt="single flight", temperature=0)
    assert runs == 1 and statuses == ["hit"] * 7 + ["miss"] and len(set(texts)) == 1
    runs, statuses, texts = burst(prompt="sampled flight", temperature=1.0)  # list size 2: two results needed
    assert runs == 2 and statuses == ["hit"] * 6 + ["miss"] * 2


def test_list_size_sampled_fills_deterministic_at_one(cc: openai.OpenAI, ch: httpx.Client, model_name: str) -> None:
    sampled: dict[str, Any] = {"model": model_name, "prompt": "sampled", "max_tokens": 4, "temperature": 1.0,
                               "extra_body": {"ignore_eos": True}}
    results = [complete(cc, **sampled) for _ in range(3)]
    assert [s for s, _ in results] == ["miss", "miss", "hit"]
    assert results[2][1].choices[0].text in {r.choices[0].text for _, r in results[:2]}
    seeded = {**sampled, "seed": 7}
    assert [complete(cc, **seeded)[0] for _ in range(2)] == ["miss", "hit"]


def test_fixed_keys_survive_pressure(cc: openai.OpenAI, ch: httpx.Client, model_name: str) -> None:
    evictions = ch.get("/response_cache").json()["evictions"]
    assert complete(cc, model=model_name, **FIXED)[0] == "miss"
    for i in range(6):
        assert complete(cc, model=model_name, prompt=f"pressure {i}", max_tokens=2, temperature=0)[0] == "miss"
    stats = ch.get("/response_cache").json()
    assert stats["entries"] == 4 + 1 and stats["fixed_keys"] == 1 and stats["evictions"] - evictions == 2
    assert complete(cc, model=model_name, **FIXED)[0] == "hit"
    assert complete(cc, model=model_name, prompt="pressure 0", max_tokens=2, temperature=0)[0] == "miss"


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def test_stats_flush_and_metrics(cc: openai.OpenAI, ch: httpx.Client, model_name: str) -> None:
    s0, m0 = ch.get("/response_cache").json(), ch.get("/metrics").text
    assert set(s0) == {"enabled", "size", "list_size", "entries", "fixed_keys", "hits", "misses", "evictions"}
    assert (s0["enabled"], s0["size"], s0["list_size"], s0["entries"]) == (True, 4, 2, 0)
    kw: dict[str, Any] = {"model": model_name, "prompt": "counted", "max_tokens": 2, "temperature": 0}
    assert [complete(cc, **kw)[0] for _ in range(3)] == ["miss", "hit", "hit"]
    s1, m1 = ch.get("/response_cache").json(), ch.get("/metrics").text
    assert (s1["hits"] - s0["hits"], s1["misses"] - s0["misses"], s1["entries"]) == (2, 1, 1)
    for name, delta in (("hits", 2), ("misses", 1)):
        metric = f"kvstrata:response_cache_{name}_total"
        assert _metric(m1, metric) - _metric(m0, metric) == delta
    assert _metric(m1, "kvstrata:response_cache_entries") == 1
    assert _metric(m1, "kvstrata:response_cache_evictions_total") == s1["evictions"]
    assert ch.post("/response_cache/flush").json() == {"status": "ok", "flushed_keys": 1}
    assert ch.get("/response_cache").json()["entries"] == 0
    assert complete(cc, **kw)[0] == "miss"
    assert ch.get("/response_cache/flush").status_code == 405
