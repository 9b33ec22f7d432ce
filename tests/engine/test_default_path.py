"""The real SmolLM2 on the server's default path (`dtype auto`: on this CPU bfloat16 or float32
prefill, quantized decode, int8 head, fused norm/RoPE ops, the C++ paged decode kernel): a shared system
prompt served from the prefix cache gives the same greedy tokens as recomputing it, and the path
it runs is the one the server logs."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvstrata.engine.llm import LLM
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.model.attention import CpuPagedBackend

pytestmark = pytest.mark.slow

SYSTEM = ("You are a support agent for a bicycle shop. Answer in one or two sentences, name the part "
          "the customer should check first, and never invent prices or opening hours. ") * 4
QUESTIONS = ["My chain keeps slipping.", "The front brake squeaks.", "How often should I pump the tyres?",
             "The gears click when I pedal.", "My saddle is too low.", "Is a rusty chain dangerous?"]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0)


def test_shared_system_prompt_from_the_cache_equals_recomputing_it(smollm2_path: Path) -> None:
    on = LLM(str(smollm2_path), max_total_tokens=8192)
    off = LLM(str(smollm2_path), max_total_tokens=8192, enable_prefix_caching=False)
    model = on.engine.model
    assert isinstance(model.attention, CpuPagedBackend) and model.uses_quant and model.fused_ops
    assert (model.decode_layers is not None) == model.uses_int_dot  # decode steps' layers in one op (ours all)
    tok = on.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "system", "content": SYSTEM},
                                                   {"role": "user", "content": q}], add_generation_prompt=True))
               for q in QUESTIONS]
    on.generate(prompts[:1], GREEDY)  # the system prompt's pages go into the cache
    with_cache = on.generate(prompts, GREEDY)  # one batch: prefills of the rest on cached pages, decode together
    alone = [off.generate([p], GREEDY)[0] for p in prompts]
    assert all(o.cached_tokens >= 128 for o in with_cache)
    assert [o.token_ids for o in with_cache] == [o.token_ids for o in alone]
