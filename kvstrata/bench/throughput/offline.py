"""`kvstrata bench throughput`: cold prefill and decode speed, kvstrata beside transformers, one run.

Figures: prefill tokens/s of one cold ~2k-token prompt, decode tokens/s at batch 1, and aggregate
decode tokens/s at batch 8. Both engines get the same weights, dtype, threads and token ids;
`--dtype auto` is kvstrata's per-CPU choice (dtype_plan.py), and transformers gets the same dtype.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from kvstrata.engine.sampling_params import SamplingParams


def _prompts(seed: int, count: int, length: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(count)]


def _timed_decode(llm: Any, prompts: list[list[int]], new_tokens: int, logprobs: int | None = None) -> float:
    """Aggregate decode tokens/s: tokens after each request's first, over the time after the
    last request's first token. `logprobs`: every request asks for its tokens' logprobs and this many
    alternatives."""
    eng = llm.engine
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True, logprobs=logprobs)
    ids = [f"tp-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts):
        eng.add_request(rid, p, params)
    started: set[str] = set()
    t_start = 0.0
    produced = 0
    while eng.has_unfinished():
        for out in eng.step():
            if out.request_id not in started:
                started.add(out.request_id)
                if len(started) == len(prompts):
                    t_start = time.perf_counter()
                continue
            if len(started) == len(prompts):
                produced += len(out.new_token_ids)
    return produced / (time.perf_counter() - t_start)


def bench_kvstrata(args: argparse.Namespace, long_prompt: list[int], short: list[list[int]]) -> dict[str, float]:
    from kvstrata.engine.llm import LLM

    llm = LLM(args.model, dtype=args.dtype, enable_prefix_caching=False, max_total_tokens=16384, q4_decode=args.q4_decode)
    llm.generate([short[0]], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    t = time.perf_counter()
    llm.generate([long_prompt], SamplingParams(max_tokens=1, temperature=0.0))
    prefill = len(long_prompt) / (time.perf_counter() - t)
    out = {
        "prefill_tps": prefill,
        "decode_tps_b1": _timed_decode(llm, short[:1], args.decode_tokens),
        "decode_tps_b8": _timed_decode(llm, short[:8], args.decode_tokens),
    }
    if args.logprobs is not None:  # between two plain b8 runs (the first b8 run above also warms that shape)
        out["decode_tps_b8_plain_before"] = _timed_decode(llm, short[:8], args.decode_tokens)
        out["decode_tps_b8_logprobs"] = _timed_decode(llm, short[:8], args.decode_tokens, args.logprobs)
        out["decode_tps_b8_plain_after"] = _timed_decode(llm, short[:8], args.decode_tokens)
    return out


def bench_transformers(args: argparse.Namespace, long_prompt: list[int], short: list[list[int]]) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from kvstrata.model.dtype_plan import plan_dtype
    from kvstrata.model.fetch import resolve_model

    path = resolve_model(args.model)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[plan_dtype(args.dtype).dtype]
    if path.suffix == ".gguf":
        hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    else:
        hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    hf.eval()

    def decode(batch: list[list[int]]) -> float:
        ids = torch.tensor(batch)
        kw = dict(do_sample=False, pad_token_id=0)
        t = time.perf_counter()
        hf.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        t_first = time.perf_counter() - t
        t = time.perf_counter()
        hf.generate(ids, max_new_tokens=args.decode_tokens, min_new_tokens=args.decode_tokens, **kw)
        return len(batch) * (args.decode_tokens - 1) / (time.perf_counter() - t - t_first)

    with torch.inference_mode():
        hf(torch.tensor([short[0]]))  # warm-up
        t = time.perf_counter()
        hf(torch.tensor([long_prompt]))
        prefill = len(long_prompt) / (time.perf_counter() - t)
        return {"prefill_tps": prefill, "decode_tps_b1": decode(short[:1]), "decode_tps_b8": decode(short[:8])}


def run_throughput(args: argparse.Namespace) -> int:
    import torch

    from kvstrata.bench.machine import machine_info, machine_line
    from kvstrata.model.dtype_plan import plan_dtype

    torch.set_num_threads(args.threads or torch.get_num_threads())
    long_prompt = _prompts(args.seed, 1, args.prefill_tokens, 49152)[0]
    short = _prompts(args.seed + 1, 8, args.decode_prompt_tokens, 49152)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    runners = {"kvstrata": bench_kvstrata, "transformers": bench_transformers}
    results: dict[str, dict[str, float]] = {}
    for name in engines:
        if name not in runners:
            raise SystemExit(f"unknown engine {name!r}; choose from {sorted(runners)}")
        print(f"running {name} ...", flush=True)
        results[name] = runners[name](args, long_prompt, short)
    cols = ["prefill_tps", "decode_tps_b1", "decode_tps_b8"]
    plan = plan_dtype(args.dtype)
    print(f"\nmodel={args.model} dtype={args.dtype} (= {plan.dtype}, {plan.reason}) q4_decode={args.q4_decode} "
          f"threads={torch.get_num_threads()} prefill_tokens={args.prefill_tokens} decode_tokens={args.decode_tokens}")
    print(machine_line())
    print(f"{'engine':<14}" + "".join(f"{c:>16}" for c in cols))
    for name, r in results.items():
        print(f"{name:<14}" + "".join(f"{r[c]:>16.1f}" for c in cols))
    if "kvstrata" in results and "transformers" in results:
        k, t = results["kvstrata"], results["transformers"]
        print(f"{'ratio':<14}" + "".join(f"{k[c] / t[c]:>15.2f}x" for c in cols))
    lp = results.get("kvstrata", {}).get("decode_tps_b8_logprobs")
    if lp is not None:
        k = results["kvstrata"]
        before, after = k["decode_tps_b8_plain_before"], k["decode_tps_b8_plain_after"]
        print(f"kvstrata b8 decode with logprobs={args.logprobs} on every request: {lp:.1f} tokens/s between plain "
              f"runs of {before:.1f} and {after:.1f}: {2 * lp / (before + after):.3f}x their mean")
    if args.output:
        out = {"args": vars(args) | {"func": None}, "dtype": plan.dtype, "machine": machine_info(), "results": results}
        Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
    return 0


def add_throughput_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="auto = kvstrata's choice for this CPU (default: %(default)s)")
    p.add_argument("--engines", default="kvstrata,transformers")
    p.add_argument("--prefill-tokens", type=int, default=2048)
    p.add_argument("--decode-prompt-tokens", type=int, default=32)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--q4-decode", default="auto", choices=["auto", "on", "off"],
                   help="kvstrata's --q4-decode (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--logprobs", type=int, default=None, choices=range(0, 21), metavar="N",
                   help="also kvstrata's b8 decode with logprobs=N on every request (0-20)")
    p.add_argument("--output", default=None)
