"""The radix prefix cache inside the engine (tiny random-weight model): hits, sharing during
chunked prefill, salts, flush, and eviction pressure with running requests."""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from kvstrata.engine.llm import LLM
from kvstrata.engine.sampling_params import SamplingParams

PS = 16
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def make(tiny_model_dir: Path, **kw: Any) -> LLM:
    kw.setdefault("dtype", "float32")
    kw.setdefault("max_total_tokens", 4096)
    return LLM(str(tiny_model_dir), **kw)


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 49000) for _ in range(n)]


def test_repeat_prompt_hits_all_but_the_last_token(tiny_model_dir: Path) -> None:
    llm = make(tiny_model_dir)
    # the first run computes n + 11 tokens: its full pages are cached, and the part page past them is a
    # tail (kv/tail_pages.py). The repeat matches whole pages up to (n - 1) // 16 and then takes the tail
    # where its match ends on the page the tail follows: n = 50 (48 cached, tail 48-60) reads 49 tokens;
    # at 64 the match ends at 48 but the tail follows 64; at 16 and 17 nothing past the match is a prompt
    # token the repeat may skip (the last one is always computed)
    for n, cached in ((16, 0), (17, 16), (50, 49), (64, 48)):
        p = tokens(n, seed=n)
        first = llm.generate([p], GREEDY)[0]
        second = llm.generate([p], GREEDY)[0]
        assert first.cached_tokens == 0
        assert second.cached_tokens == cached
        assert second.token_ids == first.token_ids
    llm.engine.check_integrity()


def test_next_turn_hits_prompt_and_reply(tiny_model_dir: Path) -> None:
    llm = make(tiny_model_dir)
    p = tokens(70, seed=1)
    out = llm.generate([p], GREEDY)[0]
    follow = p + out.token_ids + tokens(20, seed=2)
    nxt = llm.generate([follow], GREEDY)[0]
    # everything computed last turn (prompt + all replies but the last sampled token): the full pages
    # from the prefix cache, the part page after them from the tail the first turn left
    assert nxt.cached_tokens == len(p) + len(out.token_ids) - 1
    off = make(tiny_model_dir, enable_prefix_caching=False)
    assert off.generate([follow], GREEDY)[0].token_ids == nxt.token_ids


def test_concurrent_requests_share_a_new_prefix_during_chunked_prefill(tiny_model_dir: Path) -> None:
    llm = make(tiny_model_dir, chunked_prefill_size=32)
    eng = llm.engine
    system = tokens(160, seed=3)
    eng.add_request("a", system + tokens(10, seed=4), GREEDY)
    eng.step()
    eng.step()  # a has computed 64 tokens = 4 pages, already in the cache
    eng.add_request("b", system + tokens(10, seed=5), GREEDY)
    outs = {}
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished:
                outs[o.request_id] = o
        eng.check_integrity()
    assert outs["b"].cached_tokens >= 64


def test_cache_salt_isolates(tiny_model_dir: Path) -> None:
    llm = make(tiny_model_dir)
    p = tokens(80, seed=6)
    llm.generate([p], SamplingParams(max_tokens=4, temperature=0.0, extra_key="tenant-a"))
    other = llm.generate([p], SamplingParams(max_tokens=4, temperature=0.0, extra_key="tenant-b"))[0]
    same = llm.generate([p], SamplingParams(max_tokens=4, temperature=0.0, extra_key="tenant-a"))[0]
    assert other.cached_tokens == 0
    assert same.cached_tokens == 64


def test_flush_cache_keeps_running_requests(tiny_model_dir: Path) -> None:
    llm = make(tiny_model_dir)
    eng = llm.engine
    llm.generate([tokens(100, seed=7)], GREEDY)
    assert eng.prefix_cache is not None and eng.prefix_cache.num_cached_pages > 0
    eng.add_request("r", tokens(100, seed=8), SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    for _ in range(3):
        eng.step()
    eng.flush_cache()
    eng.check_integrity()
    running_pages = eng.scheduler.running[0].pages
    assert set(running_pages[: eng.scheduler.running[0].num_shared_pages]) <= eng.prefix_cache.cached_pages()
    while eng.has_unfinished():
        eng.step()
    eng.flush_cache()
    assert eng.prefix_cache.num_cached_pages == 0
    assert eng.pool.num_free == eng.pool.num_pages


def test_eviction_pressure_never_touches_running_pages(tiny_model_dir: Path) -> None:
    """A 20-page pool, many sessions sharing a system prompt: the cache evicts constantly, every
    step keeps integrity (no running request's page freed), and outputs equal a cache-less run."""
    system = tokens(48, seed=9)
    prompts = [system + tokens(10 + 7 * i, seed=100 + i) for i in range(8)]
    ref = make(tiny_model_dir, enable_prefix_caching=False).generate(prompts, GREEDY)
    llm = make(tiny_model_dir, max_total_tokens=20 * PS)
    eng = llm.engine
    for rnd in range(2):
        for i, p in enumerate(prompts):
            eng.add_request(f"{rnd}-{i}", p, GREEDY)
        got: dict[str, list[int]] = {}
        while eng.has_unfinished():
            for o in eng.step():
                got.setdefault(o.request_id, []).extend(o.new_token_ids)
            eng.check_integrity()
        assert [got[f"{rnd}-{i}"] for i in range(len(prompts))] == [r.token_ids for r in ref]
