"""The bf16 prefill kernel inside the engine, on a tiny random-weight Llama (head size 16): prompts
that share a prefix give the same greedy tokens with the prefix cache on (their suffixes attend
over cached pages) as with it off, in whole and in chunked prefill. (Where the CPU has no
avx512_bf16 the backend's prefill is torch's SDPA, and this checks that path instead.)"""
from __future__ import annotations

import random
from pathlib import Path

from kvstrata.engine.llm import LLM
from kvstrata.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 49000) for _ in range(n)]


def test_cache_on_equals_cache_off_in_bf16(tiny_model_dir: Path) -> None:
    shared = tokens(300, seed=1)
    prompts = [shared + tokens(n, seed=n) for n in (7, 40, 129)]
    runs = []
    for caching, chunk in ((False, None), (True, None), (True, 48)):
        llm = LLM(str(tiny_model_dir), dtype="bfloat16", max_total_tokens=4096, enable_prefix_caching=caching,
                  chunked_prefill_size=chunk)
        assert type(llm.engine.model.attention).__name__ == "CpuPagedBackend"  # the default on CPU
        outs = [llm.generate([p], GREEDY)[0] for p in prompts]  # one at a time: each later one hits the cache
        runs.append([o.token_ids for o in outs])
        if caching:
            assert all(o.cached_tokens >= 288 for o in outs[1:])
        llm.engine.check_integrity()
    assert runs[1] == runs[0]  # cache on == off
    assert runs[2] == runs[0]  # and prefilled in chunks of 48 over the cached pages
