"""`kvstrata bench bf16-drift`: how often bfloat16 greedy output drifts from float32, and whether the
prefix cache changes bfloat16 output (offline `LLM` API). Prints counts; `--prompts 24` by default.

The multi-turn part (`--conversations N`) replays 3-turn chats with the cache on and off: turn 2
and 3 reuse K/V that turn 1 computed in decode steps (on the int4 weights with `--q4-decode`,
bf16's default) where the cache-off run recomputes them in a prefill on the dense weights.
`--dtype auto` measures what `--dtype auto` runs on this CPU instead of bfloat16 (on AVX2: float32
with int4 decode steps, against the exact float32 path)."""
from __future__ import annotations

import argparse
import random

TOPICS = ["the ocean", "prime numbers", "a red bicycle", "coffee", "volcanoes", "the moon", "Python lists",
          "photosynthesis", "chess openings", "rainbows", "jazz", "bridges", "honey bees", "glaciers",
          "the printing press", "sourdough bread", "black holes", "origami", "the Roman empire", "tides",
          "electric cars", "mushrooms", "lighthouses", "the alphabet"]


def first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def add_bf16_drift_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--conversations", type=int, default=8, help="3-turn chats for the multi-turn part (0: skip)")
    parser.add_argument("--q4-decode", default="auto", choices=["auto", "on", "off"])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "auto"],
                        help="the engine measured against exact float32 (auto: this CPU's --dtype auto plan)")
    parser.add_argument("--model", default="smollm2",
                        help="a GGUF (or model name): float32 on its dequantized weights is the reference")
    parser.add_argument("--prefill-weights", default="auto", choices=["auto", "dense", "dequant", "int"])
    parser.add_argument("--activation-bits", default="auto", choices=["auto", "8", "16"])


def run_bf16_drift(ns: argparse.Namespace) -> int:
    from kvstrata import LLM, SamplingParams  # here, not at the top: `kvstrata --help` imports this module

    if ns.conversations:
        multiturn(ns.conversations, ns.tokens, ns.q4_decode, ns.dtype, ns.model)
    greedy = SamplingParams(max_tokens=ns.tokens, temperature=0.0)
    fp32 = LLM(ns.model, dtype="float32", enable_prefix_caching=False, q4_decode="off")
    tok = fp32.tokenizer
    rng = random.Random(0)
    system = "You are a helpful assistant. " * 8  # a shared prefix the cache will serve
    prompts = [tok.encode(tok.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": f"Tell me about {t}."}]))
        for t in rng.sample(TOPICS, min(ns.prompts, len(TOPICS)))]
    ref = [fp32.generate([p], greedy)[0].token_ids for p in prompts]
    del fp32
    quant = {"q4_decode": ns.q4_decode, "prefill_weights": ns.prefill_weights, "activation_bits": ns.activation_bits}
    off = LLM(ns.model, dtype=ns.dtype, enable_prefix_caching=False, **quant)
    bf_off = [off.generate([p], greedy)[0].token_ids for p in prompts]
    del off
    on = LLM(ns.model, dtype=ns.dtype, **quant)
    bf_on = [on.generate([p], greedy)[0] for p in prompts]  # prompt 2.. hit the shared system prompt
    hits = sum(1 for o in bf_on if o.cached_tokens > 0)
    d32 = [first_diff(a, b) for a, b in zip(ref, bf_off)]
    dcache = [first_diff(a.token_ids, b) for a, b in zip(bf_on, bf_off)]
    n = len(prompts)
    print(f"model={ns.model} prompts={n} tokens={ns.tokens} dtype={ns.dtype} q4_decode={ns.q4_decode} "
          f"prefill_weights={ns.prefill_weights} activation_bits={ns.activation_bits}")
    print(f"{ns.dtype} (cache off) identical to float32: {d32.count(None)}/{n}; "
          f"first divergence at tokens {sorted(d for d in d32 if d is not None)}")
    print(f"{ns.dtype} cache on identical to cache off: {dcache.count(None)}/{n} ({hits} served a cached prefix); "
          f"first divergence at tokens {sorted(d for d in dcache if d is not None)}")
    return 0


def multiturn(conversations: int, tokens: int, q4_decode: str, dtype: str = "bfloat16", model: str = "smollm2") -> None:
    from kvstrata import LLM, SamplingParams

    greedy = SamplingParams(max_tokens=tokens, temperature=0.0)
    topics = random.Random(1).sample(TOPICS, min(conversations, len(TOPICS)))
    runs: list[list[list[int]]] = []
    for caching in (False, True):
        llm = LLM(model, dtype=dtype, enable_prefix_caching=caching, q4_decode=q4_decode)
        outs: list[list[int]] = []
        for topic in topics:
            chat = [{"role": "system", "content": "You are a helpful assistant."}]
            for question in (f"Tell me about {topic}.", "Say more.", "Summarize that in one line."):
                chat.append({"role": "user", "content": question})
                out = llm.chat(chat, greedy)
                outs.append(out.token_ids)
                chat.append({"role": "assistant", "content": out.text})
        runs.append(outs)
        del llm
    d = [first_diff(a, b) for a, b in zip(*runs)]
    print(f"multi-turn {dtype} q4_decode={q4_decode}: cache on identical to cache off: {d.count(None)}/{len(d)} replies "
          f"({len(topics)} chats x 3 turns); first divergence at tokens {sorted(x for x in d if x is not None)}")
