"""Compiled grammars (engine/grammar_cache.py): compiled once per grammar, copied per request, and
compiled off the engine thread, so a running stream keeps getting tokens while a new constrained
request's grammar compiles."""
from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.engine.grammar_cache import COMPILE_THREAD
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.serving.tool_calls.constraints import json_grammar

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}


@pytest.fixture(scope="module")
def aengine(tiny_model_dir: Path) -> Iterator[AsyncEngine]:
    eng = AsyncEngine.from_config(ModelConfig(model=str(tiny_model_dir), dtype="float32", max_model_len=1024),
                                  CacheConfig(max_total_tokens=4096, page_size=16), SchedulerConfig())
    eng.engine.grammar.prepare()  # what the server's warm-up does
    yield eng
    eng.shutdown()


def test_one_compile_per_grammar_and_independent_copies(aengine: AsyncEngine) -> None:
    cache = aengine.engine.grammars
    grammar = json_grammar({**SCHEMA, "title": "once"})
    before = cache.compiled
    first, second = cache.matcher(grammar), cache.matcher(grammar)
    assert cache.compiled == before + 1 and first is not second
    brace = aengine.tokenizer.encode("{")
    assert first.consume_tokens(brace)
    assert second.validate_tokens(brace) == len(brace)  # the copy is still at the start


async def _tokens_during_compile(eng: AsyncEngine, compile_s: float) -> tuple[int, int]:
    """(tokens a running stream got while a grammar compiled, tokens it got in all)."""
    backend = eng.engine.grammar
    real = backend.matcher
    window: list[float] = []
    threads: list[str] = []

    def slow_matcher(grammar: str) -> Any:
        threads.append(threading.current_thread().name)
        window.append(time.monotonic())
        time.sleep(compile_s)  # llguidance's compile drops the GIL too
        m = real(grammar)
        window.append(time.monotonic())
        return m

    backend.matcher = slow_matcher  # type: ignore[method-assign]
    try:
        stamps: list[float] = []
        long = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)

        async def stream() -> None:
            async for out in eng.generate("long", eng.tokenizer.encode("a long story"), long):
                stamps.extend([time.monotonic()] * len(out.new_token_ids))  # a verify step brings several

        task = asyncio.create_task(stream())
        while len(stamps) < 5:
            await asyncio.sleep(0.01)
        constrained = SamplingParams(max_tokens=8, temperature=0, grammar=json_grammar({**SCHEMA, "title": "slow"}))
        async for _ in eng.generate("constrained", eng.tokenizer.encode("json please"), constrained):
            pass
        await task
    finally:
        backend.matcher = real  # type: ignore[method-assign]
    assert threads and all(name.startswith(COMPILE_THREAD) for name in threads), threads
    start, end = window
    return sum(start <= t <= end for t in stamps), len(stamps)


def test_a_stream_keeps_flowing_while_a_grammar_compiles(aengine: AsyncEngine) -> None:
    during, total = asyncio.run(_tokens_during_compile(aengine, compile_s=1.0))
    assert total == 400
    assert during > 0, "the stream got no token while the grammar compiled: the step loop waited on it"
