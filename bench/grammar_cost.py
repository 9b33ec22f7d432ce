"""Per-token cost of constrained decoding (llguidance mask) on SmolLM2, float32, one request.

Same prompt, greedy, 64 decode tokens, prefix cache off; runs alternate plain / constrained
(a JSON object whose one string property can run for the whole budget) so both sides see the
same load on a shared machine. Prints ms per decode token (median over runs) and the mask's own
time per token measured inside the step.

    PYTHONPATH=. python bench/grammar_cost.py [--runs 5] [--tokens 64]
"""
from __future__ import annotations

import argparse
import statistics
import time

from kvstrata.engine.engine import Engine
from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.serving.tool_calls.constraints import json_grammar

SCHEMA = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
PROMPT = "<|im_start|>user\nTell me a long story about a lighthouse keeper, as JSON.<|im_end|>\n<|im_start|>assistant\n"


def decode_ms_per_token(engine: Engine, params: SamplingParams, tag: str) -> tuple[float, int]:
    ids = engine.tokenizer.encode(PROMPT)
    engine.add_request(tag, ids, params)
    first = None
    n = 0
    while engine.has_unfinished():
        for out in engine.step():
            n = out.output_tokens
            if first is None and n >= 1:
                first = time.perf_counter()
    end = time.perf_counter()
    assert first is not None and n > 1
    return (end - first) * 1000 / (n - 1), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    engine = Engine(ModelConfig(model="smollm2", dtype="float32", num_threads=args.threads),
                    CacheConfig(max_total_tokens=4096, enable_prefix_caching=False, enable_kvstore=False),
                    SchedulerConfig())
    plain = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
    constrained = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True, grammar=json_grammar(SCHEMA))
    t0 = time.perf_counter()
    engine.grammar.matcher(constrained.grammar or "")  # llguidance's tokenizer, built once
    print(f"llguidance tokenizer + first matcher: {(time.perf_counter() - t0) * 1000:.0f} ms (once per server)")
    mask_s = [0.0]
    inner = engine.grammar.mask_logits

    def timed(logits, matchers):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        out = inner(logits, matchers)
        mask_s[0] += time.perf_counter() - t
        return out

    engine.grammar.mask_logits = timed  # type: ignore[method-assign]
    a, b, counts = [], [], []
    for run in range(args.runs):
        a.append(decode_ms_per_token(engine, plain, f"p{run}")[0])
        mask_s[0] = 0.0
        ms, n = decode_ms_per_token(engine, constrained, f"c{run}")
        b.append(ms)
        counts.append(mask_s[0] * 1000 / n)
    pa, pb = statistics.median(a), statistics.median(b)
    print(f"plain       {pa:.2f} ms/token  (runs: {', '.join(f'{x:.1f}' for x in a)})")
    print(f"constrained {pb:.2f} ms/token  (runs: {', '.join(f'{x:.1f}' for x in b)})")
    print(f"difference  {pb - pa:+.2f} ms/token; mask alone {statistics.median(counts):.2f} ms/token")


if __name__ == "__main__":
    main()
