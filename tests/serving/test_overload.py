"""Overload: a full waiting queue answers 429 with Retry-After; per-request `timeout` answers 408."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any, Iterator

import httpx
import pytest

from kvstrata.config import ModelConfig
from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.engine.outputs import RequestOutput
from serving_support import CACHE, SCHED, assert_error, make_state, serve

QUEUE_LIMIT = 4
LONG = {"max_tokens": 48, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def small_queue(model_cfg: ModelConfig) -> Iterator[tuple[AsyncEngine, str]]:
    eng = AsyncEngine.from_config(model_cfg, CACHE, replace(SCHED, max_num_seqs=2, max_queue_requests=QUEUE_LIMIT))
    with serve(make_state(eng)) as srv:
        yield eng, srv.base_url
    eng.shutdown()


def settled(eng: AsyncEngine, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while eng.engine.has_unfinished() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not eng.engine.has_unfinished()


def test_burst_of_four_times_the_queue_gets_429_for_the_extra(small_queue: tuple[AsyncEngine, str]) -> None:
    eng, url = small_queue
    burst = 4 * QUEUE_LIMIT

    async def one(client: httpx.AsyncClient, i: int) -> httpx.Response:
        return await client.post("/v1/completions", json={"prompt": f"request {i} says", **LONG})

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=burst)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(burst))), 60)

    started = time.monotonic()
    responses = asyncio.run(run())
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 429}, codes
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(ok) >= QUEUE_LIMIT and len(refused) >= burst - 2 * QUEUE_LIMIT - 2, codes
    for r in ok:
        assert r.json()["usage"]["completion_tokens"] == LONG["max_tokens"]
    for r in refused:
        assert_error(r, 429, code="overloaded")
        assert int(r.headers["retry-after"]) >= 1
    assert time.monotonic() - started < 30
    assert settled(eng)
    eng.engine.check_integrity()
    assert eng.engine.pool.num_in_use == eng.engine.scheduler.kv.kept_pages


def test_queue_frees_up_after_the_burst(small_queue: tuple[AsyncEngine, str]) -> None:
    _, url = small_queue
    resp = httpx.post(f"{url}/v1/completions", json={"prompt": "after", "max_tokens": 2}, timeout=30)
    assert resp.status_code == 200


def test_timeout_aborts_and_answers_408(small_queue: tuple[AsyncEngine, str]) -> None:
    eng, url = small_queue
    body = {"prompt": "a long story", "max_tokens": 1500, "ignore_eos": True, "timeout": 0.3}
    finished: list[RequestOutput] = []
    eng.on_finish.append(finished.append)
    try:
        resp = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert_error(resp, 408, param="timeout", code="timeout")
        assert settled(eng)
    finally:
        eng.on_finish.remove(finished.append)
    (out,) = finished  # aborted, far short of its 1500 tokens (not timed out after generating them)
    assert out.finish_reason == "abort" and out.output_tokens < body["max_tokens"], out


def test_timeout_mid_stream_is_an_error_event(small_queue: tuple[AsyncEngine, str]) -> None:
    eng, url = small_queue
    body: dict[str, Any] = {"prompt": "a long story", "max_tokens": 1500, "ignore_eos": True, "timeout": 0.5,
                            "stream": True}
    events = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    assert "choices" in events[0] and events[-1]["error"]["code"] == "timeout"
    assert settled(eng)


@pytest.mark.parametrize("bad", [0, -1, "5", 1e9])
def test_bad_timeout_is_a_400(small_queue: tuple[AsyncEngine, str], bad: Any) -> None:
    _, url = small_queue
    resp = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "timeout": bad}, timeout=30)
    assert_error(resp, 400, param="timeout")


def test_a_timeout_long_enough_changes_nothing(small_queue: tuple[AsyncEngine, str]) -> None:
    _, url = small_queue
    body = {"prompt": "x", "max_tokens": 4, "ignore_eos": True, "temperature": 0}
    plain = httpx.post(f"{url}/v1/completions", json=body, timeout=30).json()
    timed = httpx.post(f"{url}/v1/completions", json={**body, "timeout": 30}, timeout=30).json()
    assert timed["choices"][0]["text"] == plain["choices"][0]["text"]
