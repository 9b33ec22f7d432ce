"""An agent's later turn, offline: a long prompt cached, then steps of a few new tokens over it.

    .venv/bin/python bench/later_turn.py --model FILE [--context 12288] [--new 2,4,8,12,24] [--repeats 3]
                                         [--prefill-narrow-rows N] [--against-narrow-rows N] [--profile N]

Loads the model as `kvstrata serve` would (32k-token pool), prefills one `--context`-token prompt (timed:
the cold prefill), then for each N in `--new` runs `--repeats` requests of that prompt plus N fresh tokens
and one output token: each reads the prompt from the prefix cache and computes N rows over it, which is
what a turn after a tool call costs the engine. Prints ms a request. `--prefill-narrow-rows` overrides
`LlamaModel.prefill_narrow_rows` (the widest prompt step on the quantized kernels);
`--against-narrow-rows N` alternates each request with one at N, in the same process, for an A/B;
`--profile N` adds torch.profiler's top ops of one request with N new tokens.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

sys.path.insert(0, ".")
from kvstrata.engine.llm import LLM  # noqa: E402
from kvstrata.engine.sampling_params import SamplingParams  # noqa: E402
from step_profile import profiled  # noqa: E402  (bench/, this script's folder: wall time and top ops)

ONE = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--context", type=int, default=12288)
    ap.add_argument("--new", default="2,4,8,12,24")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prefill-narrow-rows", type=int, default=None)
    ap.add_argument("--against-narrow-rows", type=int, default=None)
    ap.add_argument("--profile", type=int, default=None)
    a = ap.parse_args()
    llm = LLM(a.model, max_total_tokens=32768)
    if a.prefill_narrow_rows is not None:
        llm.engine.model.prefill_narrow_rows = a.prefill_narrow_rows
    print(f"prefill_narrow_rows {llm.engine.model.prefill_narrow_rows}")
    rng = random.Random(0)
    base = [rng.randrange(100, 49000) for _ in range(a.context)]
    llm.generate([base[:64]], ONE)  # warm-up
    t = time.perf_counter()
    llm.generate([base], ONE)
    print(f"cold {a.context} tokens: {time.perf_counter() - t:.2f} s")
    narrow = [llm.engine.model.prefill_narrow_rows]
    if a.against_narrow_rows is not None and a.against_narrow_rows != narrow[0]:
        narrow.append(a.against_narrow_rows)
    for new in (int(n) for n in a.new.split(",")):
        times: dict[int, list[float]] = {n: [] for n in narrow}
        for _ in range(a.repeats):
            for rows in narrow:
                llm.engine.model.prefill_narrow_rows = rows
                prompt = base + [rng.randrange(100, 49000) for _ in range(new)]
                t = time.perf_counter()
                llm.generate([prompt], ONE)
                times[rows].append((time.perf_counter() - t) * 1e3)
        print(f"+{new} new tokens: " + " | ".join(
            (f"narrow {rows}: " if len(narrow) > 1 else "") + " ".join(f"{x:.0f}" for x in ms) for rows, ms in times.items())
              + " ms")
    llm.engine.model.prefill_narrow_rows = narrow[0]
    if a.profile:
        prompt = base + [rng.randrange(100, 49000) for _ in range(a.profile)]
        profiled(lambda: llm.generate([prompt], ONE), True, f"+{a.profile} new tokens")


if __name__ == "__main__":
    main()
