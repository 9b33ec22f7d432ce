"""Requests that arrive together with a shared, uncached prefix compute it once (prefill_dedup.py)."""
from __future__ import annotations

import random
from pathlib import Path
import pytest
import torch

from kvstrata.engine.llm import LLM
from kvstrata.engine.prefill_dedup import shared_full_pages
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.model.cascade_attention import cascade_decode_attention

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PS = 16


def test_shared_full_pages() -> None:
    a = list(range(100))
    assert shared_full_pages(a, a, PS) == 6  # 100 // 16: only full pages count
    b = a[:40] + [7] * 60
    assert shared_full_pages(a, b, PS) == 2  # page 2 (tokens 32-47) differs at token 40
    assert shared_full_pages(a, [], PS) == 0
    assert shared_full_pages([1] * 5, [1] * 5, PS) == 0


def _run(tiny_model_dir: Path, dedup: bool, prompts: list[list[int]],
         attention_backend: str = "auto") -> tuple[list[list[int]], int]:
    llm = LLM(str(tiny_model_dir), dtype="float32", max_total_tokens=4096, chunked_prefill_size=64,
              max_num_batched_tokens=256, dedup_prefill=dedup, attention_backend=attention_backend)
    eng = llm.engine
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, GREEDY)
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    computed = 0  # prompt tokens run through the model, over all steps
    while eng.has_unfinished():
        batch = eng.scheduler.schedule()
        computed += sum(n for r, n in zip(batch.requests, batch.num_tokens) if r.num_computed_tokens < r.num_prompt_tokens)
        for out in eng.postprocess(batch, eng.runner.run(batch)):
            got[out.request_id].extend(out.new_token_ids)
    eng.check_integrity()
    return [got[f"r{i}"] for i in range(len(prompts))], computed


def test_shared_prefix_is_prefilled_once(tiny_model_dir: Path) -> None:
    rng = random.Random(0)
    system = [rng.randrange(3, 49000) for _ in range(300)]  # 18 full pages, 5 chunks of 64
    prompts = [system + [rng.randrange(3, 49000) for _ in range(20 + 7 * i)] for i in range(4)]
    outs_on, computed_on = _run(tiny_model_dir, True, prompts)
    outs_off, computed_off = _run(tiny_model_dir, False, prompts)
    assert outs_on == outs_off  # same greedy tokens either way
    total = sum(len(p) for p in prompts)
    shared = (300 // PS) * PS
    assert computed_off == total  # all four computed the system prompt side by side
    assert computed_on == total - 3 * shared  # the three followers hit it instead


def test_other_tenants_do_not_wait(tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32", max_total_tokens=4096, chunked_prefill_size=64,
              max_num_batched_tokens=256)
    eng = llm.engine
    prompt = list(range(3, 203))
    eng.add_request("a", prompt, SamplingParams(max_tokens=4, temperature=0.0, extra_key="tenant-a"))
    eng.add_request("b", prompt, SamplingParams(max_tokens=4, temperature=0.0, extra_key="tenant-b"))
    eng.add_request("c", prompt, SamplingParams(max_tokens=4, temperature=0.0, extra_key="tenant-a"))
    batch = eng.scheduler.schedule()
    # b cannot share a's pages (another namespace), so it starts at once; c follows a
    assert [r.request_id for r in batch.requests] == ["a", "b"]
    while eng.has_unfinished():
        batch = eng.scheduler.schedule()
        eng.postprocess(batch, eng.runner.run(batch))
    eng.check_integrity()


def test_shared_prefix_batch_matches_each_alone(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four sessions decoding together on shared pages (cascade attention, which the torch_sdpa
    backend takes; cpu_paged reads shared pages in place) == each one alone."""
    from kvstrata.model import attention

    calls: list[int] = []

    def counted(q: torch.Tensor, *args: torch.Tensor) -> torch.Tensor:
        calls.append(q.shape[0])
        return cascade_decode_attention(q, *args)

    monkeypatch.setattr(attention, "cascade_decode_attention", counted)
    rng = random.Random(1)
    system = [rng.randrange(3, 49000) for _ in range(200)]
    prompts = [system + [rng.randrange(3, 49000) for _ in range(5 + 9 * i)] for i in range(4)]
    together, _ = _run(tiny_model_dir, True, prompts, "torch_sdpa")
    assert calls and max(calls) == 4  # the batch did decode through the cascade path
    calls.clear()
    alone = [_run(tiny_model_dir, True, [p], "torch_sdpa")[0][0] for p in prompts]
    assert together == alone
    assert not calls  # one row alone never takes it
