"""KVCacheManager.commit in the engine: each filled page is handed to the cache once, continuing
below the request's cache node (the prefix above it is never re-packed or re-walked)."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from kvstrata.engine.llm import LLM
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.kv import radix

PS = 16


def test_commit_packs_each_page_once_and_matches_cache_off(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(0)
    prompt = [rng.randrange(3, 49000) for _ in range(40)]
    params = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
    llm = LLM(str(tiny_model_dir), dtype="float32", max_total_tokens=4096, chunked_prefill_size=16)
    packed: list[int] = []
    real = radix.token_bytes
    monkeypatch.setattr(radix, "token_bytes", lambda toks: packed.append(len(toks)) or real(toks))
    out = llm.generate([prompt], params)[0]
    computed = len(prompt) + len(out.token_ids) - 1  # the last sampled token is never computed
    # (a cold cache: admission's match packs nothing) each commit packs only the pages it adds; the
    # old commit re-packed the whole prefix at every page: ~L^2 / (2 PS) tokens in all
    assert sum(packed) == computed // PS * PS
    assert all(n % PS == 0 and n <= 2 * PS for n in packed), packed
    llm.engine.check_integrity()
    one = SamplingParams(max_tokens=1, temperature=0.0)
    again = llm.generate([prompt + out.token_ids], one)[0]
    assert again.cached_tokens == computed  # the full pages, then the part page the first run left as a tail
    off = LLM(str(tiny_model_dir), dtype="float32", max_total_tokens=4096, enable_prefix_caching=False)
    assert off.generate([prompt], params)[0].token_ids == out.token_ids
    assert off.generate([prompt + out.token_ids], one)[0].token_ids == again.token_ids


def _classes(llm: LLM, prompt: list[int]) -> list[tuple[int, float]]:
    """(class, retain_until) of each cached page of `prompt`'s prefix, in order."""
    cache = llm.engine.prefix_cache
    assert cache is not None
    m = cache.match(prompt)
    out, node = [], m.node
    while node is not None and node.page is not None:
        out.append((node.cls, node.retain_until))
        node = node.parent
    return out[::-1]


def test_a_breakpoint_retains_the_pages_before_it_only(tiny_model_dir: Path) -> None:
    from kvstrata.kv.eviction_policy import RETAINED, now

    rng = random.Random(1)
    prompt = [rng.randrange(3, 49000) for _ in range(100)]
    llm = LLM(str(tiny_model_dir), dtype="float32", max_total_tokens=4096, chunked_prefill_size=32)
    params = SamplingParams(max_tokens=1, temperature=0.0, retention="5m", retain_tokens=40)
    llm.generate([prompt], params)
    classes = _classes(llm, prompt)
    assert len(classes) == 100 // PS
    assert [c for c, _ in classes[:2]] == [RETAINED] * 2  # pages 0-1 end at token 32 <= 40
    assert all(c != RETAINED and until == 0.0 for c, until in classes[2:])
    assert all(now() + 290 < until <= now() + 300 for _, until in classes[:2])
    # a later request with a 1 h breakpoint further on refreshes the prefix and retains up to its own edge
    longer = prompt + [rng.randrange(3, 49000) for _ in range(20)]
    llm.generate([longer], SamplingParams(max_tokens=1, temperature=0.0, retention="1h", retain_tokens=80))
    classes = _classes(llm, longer)
    assert [c for c, _ in classes[:5]] == [RETAINED] * 5 and all(c != RETAINED for c, _ in classes[5:])
    assert all(until > now() + 3000 for _, until in classes[:5])
    llm.engine.check_integrity()
