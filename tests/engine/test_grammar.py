"""Constrained decoding (llguidance): outputs follow their schema, sampled and greedy.

50 seeded samples (temperature 1) of a random-weight model (fewer for the other call formats), which left alone writes noise, each
validated with `jsonschema`; one greedy call from the real SmolLM2 (float32)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import numpy as np
import pytest
import torch

from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.engine.engine import Engine
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.serving.tool_calls.constraints import json_grammar, tool_call_grammar
from kvstrata.serving.tool_calls.formats import FORMATS
from kvstrata.serving.tool_calls.output import chat_message

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "active"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
        "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                                         "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
        "required": ["a", "b"], "additionalProperties": False}}},
]
PROMPT = "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"


def run_all(engine: Engine, prompt: list[int], params: list[SamplingParams]) -> list[tuple[str, str | None]]:
    for i, p in enumerate(params):
        engine.add_request(f"r{i}", prompt, p)
    texts: dict[str, str] = {}
    reasons: dict[str, str | None] = {}
    while engine.has_unfinished():
        for out in engine.step():
            texts[out.request_id] = texts.get(out.request_id, "") + out.new_text
            reasons[out.request_id] = out.finish_reason
    return [(texts[f"r{i}"], reasons[f"r{i}"]) for i in range(len(params))]


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir: Path) -> Iterator[Engine]:
    threads = torch.get_num_threads()  # one thread: per-row sampling of 50 rows is many small ops
    yield Engine(ModelConfig(model=str(tiny_model_dir), dtype="float32", num_threads=1),
                 CacheConfig(max_total_tokens=32768), SchedulerConfig(max_num_seqs=64))
    torch.set_num_threads(threads)


def test_fifty_seeded_samples_follow_the_schema(tiny_engine: Engine) -> None:
    prompt = tiny_engine.tokenizer.encode(PROMPT)
    grammar = json_grammar(PERSON)
    params = [SamplingParams(max_tokens=80, temperature=1.0, seed=s, grammar=grammar) for s in range(50)]
    outs = run_all(tiny_engine, prompt, params)
    for text, reason in outs:
        assert reason == "stop", text
        jsonschema.validate(json.loads(text), PERSON)
    assert len({text for text, _ in outs}) > 25  # sampled, not one forced string
    free = run_all(tiny_engine, prompt, [SamplingParams(max_tokens=40, temperature=1.0, seed=0)])[0][0]
    with pytest.raises(ValueError):  # the same model unconstrained writes no JSON
        jsonschema.validate(json.loads(free), PERSON)


@pytest.mark.parametrize("fmt, samples", [("json", 50), ("hermes", 12), ("llama3_json", 12)])
def test_seeded_forced_calls_are_valid_calls(tiny_engine: Engine, fmt: str, samples: int) -> None:
    prompt = tiny_engine.tokenizer.encode(PROMPT)
    grammar = tool_call_grammar(FORMATS[fmt], TOOLS)
    outs = run_all(tiny_engine, prompt,
                   [SamplingParams(max_tokens=64, temperature=1.0, seed=s, grammar=grammar) for s in range(samples)])
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    names = set()
    for text, reason in outs:
        message, finish = chat_message(FORMATS[fmt], text, reason)
        assert finish == "tool_calls" and len(message["tool_calls"]) == 1, text
        call = message["tool_calls"][0]["function"]
        names.add(call["name"])
        jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])
    if samples >= 50:
        assert names == set(schemas)  # both tools get called across seeds


def test_no_grammar_costs_nothing_extra(tiny_engine: Engine) -> None:
    """Unconstrained rows in a batch with constrained ones keep their exact (greedy) output."""
    prompt = tiny_engine.tokenizer.encode(PROMPT)
    alone = run_all(tiny_engine, prompt, [SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)])
    mixed = run_all(tiny_engine, prompt, [SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
                                          SamplingParams(max_tokens=12, temperature=0, grammar=json_grammar(PERSON))])
    assert mixed[0] == alone[0]


@pytest.mark.slow
def test_smollm2_forced_call_is_valid(smollm2_path: Path) -> None:
    engine = Engine(ModelConfig(model=str(smollm2_path), dtype="float32"), CacheConfig(max_total_tokens=4096),
                    SchedulerConfig())
    prompt = engine.tokenizer.encode(PROMPT)
    (text, reason), = run_all(engine, prompt, [SamplingParams(max_tokens=40, temperature=0,
                                                             grammar=tool_call_grammar(FORMATS["json"], TOOLS))])
    message, finish = chat_message(FORMATS["json"], text, reason)
    assert finish == "tool_calls", text
    call: dict[str, Any] = message["tool_calls"][0]["function"]
    assert call["name"] == "get_weather"  # recorded: {"name": "get_weather", "arguments": {"city": "Paris"}}
    jsonschema.validate(json.loads(call["arguments"]), TOOLS[0]["function"]["parameters"])


def _mask(matcher: Any, words: int) -> list[int]:
    bits = np.zeros(words, dtype=np.int32)
    matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
    return bits.tolist()


@pytest.mark.parametrize("left", [1, 2, 3])
def test_masking_a_draft_leaves_the_matcher_where_it_was(tiny_engine: Engine, left: int) -> None:
    """A draft that completes the call then drafts EOS (a suffix drafter copies a whole earlier call and its
    end of turn): the draft's rows are masked, and the request's matcher is left in its own state, so the
    model's token after a rejected draft is judged there. Walked then rolled back on the matcher itself,
    the EOS a stopped matcher takes without recording cost one token too many: `{"city":` lost its state
    and the opening quote the model wrote next was refused (a CI failure of the agents test)."""
    backend, tok = tiny_engine.grammar, tiny_engine.tokenizer
    matcher = tiny_engine.grammars.matcher(tool_call_grammar(FORMATS["json"], TOOLS))
    call = tok.encode('{"name": "get_weather", "arguments": {"city": "Paris"}}')
    for t in call[:-left]:
        assert matcher.consume_token(t)
    before = _mask(matcher, backend.mask_words)
    draft = call[-left:] + [tok.eos_token_ids[0]]
    assert matcher.validate_tokens(draft) == len(draft)
    masked = backend.mask_logits(torch.zeros(len(draft) + 1, backend.vocab_size), [matcher], [draft])
    assert torch.isfinite(masked[-1]).sum() == 1  # after the call: only EOS
    assert _mask(matcher, backend.mask_words) == before
    for t in call[-left:]:  # the model's own tokens are still what the grammar expects here
        assert matcher.consume_token(t), matcher.get_error()
    assert matcher.is_stopped() and not matcher.is_error()
