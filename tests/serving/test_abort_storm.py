"""Abort storm: 300 streaming requests dropped at random points leave no page, request or stream behind.

A small pool (128 pages) and 32 clients at once make the engine preempt too; a third of the
prompts share a long prefix, so aborted requests hold shared (locked) prefix pages when dropped.
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import replace
from typing import Iterator

import httpx
import pytest

from kvstrata.config import CacheConfig, ModelConfig
from kvstrata.config_server import ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.serving.state import ServerState
from serving_support import SCHED, make_state, serve

REQUESTS = 300
CONCURRENCY = 32
SHARED = "You are a careful assistant. Answer briefly and cite the manual. " * 3


@pytest.fixture(scope="module")
def storm_target(model_cfg: ModelConfig) -> Iterator[tuple[AsyncEngine, ServerState, str]]:
    eng = AsyncEngine.from_config(
        replace(model_cfg, max_model_len=256), CacheConfig(max_total_tokens=2048, page_size=16), SCHED
    )
    state = make_state(eng, ServerConfig(port=0, response_cache_size=64))
    with serve(state) as srv:
        yield eng, state, srv.base_url
    eng.shutdown()


async def one(client: httpx.AsyncClient, rng: random.Random, i: int) -> str:
    """Send request i and drop it after a random number of events (or read it all); say which."""
    prompt = (SHARED if i % 3 == 0 else "") + f"question {i}: {rng.random()}"
    body = {"prompt": prompt, "max_tokens": rng.randint(4, 48), "ignore_eos": True, "stream": True,
            "temperature": rng.choice([0, 0.8])}
    keep = rng.choice([0, 1, 2, 5, 10, 20, 1000])
    seen = 0
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                return f"status {resp.status_code}"
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    seen += 1
                    if seen >= keep:
                        return "dropped"  # leaving the block closes the connection mid-stream
    except httpx.TimeoutException:
        return "timeout"
    return "finished"


def test_abort_storm_leaks_nothing(storm_target: tuple[AsyncEngine, ServerState, str]) -> None:
    eng, state, url = storm_target
    engine = eng.engine
    free_before = engine.pool.num_free + engine.scheduler.kv.evictable_pages
    rng = random.Random(8)

    async def storm() -> list[str]:
        gate = asyncio.Semaphore(CONCURRENCY)
        limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:

            async def bounded(i: int) -> str:
                async with gate:
                    return await one(client, rng, i)

            return await asyncio.gather(*(bounded(i) for i in range(REQUESTS)))

    started = time.monotonic()
    outcomes = asyncio.run(storm())
    assert outcomes.count("dropped") >= REQUESTS // 2 and outcomes.count("finished") >= 10, outcomes
    assert set(outcomes) <= {"dropped", "finished"}, sorted(set(outcomes))
    deadline = time.monotonic() + 10
    while (engine.has_unfinished() or eng._streams) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not engine.has_unfinished() and not eng._streams  # every aborted request reached the engine
    engine.check_integrity()  # no page is held by a finished or aborted request
    kv = engine.scheduler.kv
    assert engine.pool.num_in_use == kv.kept_pages and not engine.scheduler.running
    assert not engine._requests and not engine.outputs._states  # no per-request state left behind
    assert not state.response_cache._flights._running  # every response-cache slot released
    assert engine.pool.num_free + kv.evictable_pages == engine.pool.num_pages >= free_before  # all memory reclaimable
    resp = httpx.post(f"{url}/v1/completions", json={"prompt": SHARED, "max_tokens": 2}, timeout=30)
    assert resp.status_code == 200  # and the server still serves
    assert time.monotonic() - started < 60
