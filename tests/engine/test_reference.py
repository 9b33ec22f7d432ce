"""The real SmolLM2 in float32: greedy tokens identical to Hugging Face transformers, one at a time,
as one batch of different lengths, and with the prefix cache serving multi-turn history."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kvstrata.engine.llm import LLM
from kvstrata.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Write a Python function that reverses a string."}],
    [{"role": "user", "content": "List three colours of the rainbow, one per line."}],
    [{"role": "user", "content": "Explain in two sentences why the sky is blue, "
                                 "using words a child would understand. Keep it short and friendly."}],
    [{"role": "user", "content": "Translate 'good morning' to French and Spanish."},
     {"role": "assistant", "content": "Bonjour; buenos días."},
     {"role": "user", "content": "And to German?"}],
]
NEW_TOKENS = 32
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)


@pytest.fixture(scope="module")
def llm(smollm2_path: Path) -> LLM:
    return LLM(str(smollm2_path), dtype="float32", max_total_tokens=8192)


@pytest.fixture(scope="module")
def prompts(llm: LLM) -> list[list[int]]:
    tok = llm.tokenizer
    return [tok.encode(tok.apply_chat_template(c, add_generation_prompt=True)) for c in CONVERSATIONS]


@pytest.fixture(scope="module")
def hf_outputs(smollm2_path: Path, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32
    )
    model.eval()
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 pad_token_id=2)[0, len(p):]
            outs.append(ids.tolist())
    return outs


def test_prompts_have_different_lengths(prompts: list[list[int]]) -> None:
    assert len({len(p) for p in prompts}) == len(prompts)


def test_one_at_a_time_matches_transformers(llm: LLM, prompts: list[list[int]], hf_outputs: Any) -> None:
    llm.engine.flush_cache()
    ours = [llm.generate([p], GREEDY)[0].token_ids for p in prompts]
    assert ours == hf_outputs


def test_batch_matches_transformers(llm: LLM, prompts: list[list[int]], hf_outputs: Any) -> None:
    llm.engine.flush_cache()
    ours = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    assert ours == hf_outputs
    llm.engine.check_integrity()


def test_multi_turn_cache_on_equals_cache_off(smollm2_path: Path, llm: LLM) -> None:
    """Turn k re-sends turn k-1's prompt and reply: with caching the history comes from the cache
    (cached_tokens grows), and every reply is token-identical to a cache-less engine's."""
    off = LLM(str(smollm2_path), dtype="float32", max_total_tokens=8192, enable_prefix_caching=False)
    llm.engine.flush_cache()
    history: list[dict[str, str]] = [{"role": "system", "content": "You answer in one short sentence."}]
    questions = ["Name a planet.", "Is it bigger than Earth?", "How far is it from the Sun?"]
    cached = []
    for q in questions:
        history.append({"role": "user", "content": q})
        text = llm.tokenizer.apply_chat_template(history, add_generation_prompt=True)
        ids = llm.tokenizer.encode(text)
        on_out = llm.generate([ids], SamplingParams(max_tokens=24, temperature=0.0))[0]
        off_out = off.generate([ids], SamplingParams(max_tokens=24, temperature=0.0))[0]
        assert on_out.token_ids == off_out.token_ids
        assert off_out.cached_tokens == 0
        cached.append(on_out.cached_tokens)
        history.append({"role": "assistant", "content": on_out.text})
    assert cached[0] == 0 and cached[1] > 0 and cached[2] > cached[1]
    llm.engine.check_integrity()
