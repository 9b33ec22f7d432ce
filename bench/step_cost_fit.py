"""How well the speculative cost model (kvstrata/engine/spec/cost.py) predicts real verify steps, offline.

    .venv/bin/python bench/step_cost_fit.py [--model smollm2] [--turns 4] [--seed 0]

Runs the edit workload's first `--turns` code and JSON turns (kvstrata/bench/spec/workload.py) one at a
time through an `LLM` with the default speculation (`auto`), times every step of one request (the
runner's pass: prepare, forward, verify) and prints, by the step's row count, the median measured time
beside the time `StepCost` predicted for that step's rows and context (the figure the cost model weighs
drafted tokens against), and the median time of the engine's own work around it (`Speculator.draft`, and
`Engine.postprocess`). A prediction above the measured time at wide steps means drafts priced too dear
there; one below, too cheap.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

sys.path.insert(0, ".")
from kvstrata import LLM, SamplingParams  # noqa: E402
from kvstrata.bench.spec.command import reply_cap  # noqa: E402
from kvstrata.bench.spec.workload import EditConfig, generate_edit  # noqa: E402

BUCKETS = ((1, 1), (2, 4), (5, 8), (9, 12), (13, 17))  # a step's rows: its token and the drafted ones


def timed(fn: Any, sink: list[tuple[int, float]], rows: Any) -> Any:
    """`fn` wrapped: each call's seconds go to `sink` beside `rows(args)` (read after the call)."""
    def wrapper(*args: Any) -> Any:
        t = time.perf_counter()
        out = fn(*args)
        sink.append((rows(*args), time.perf_counter() - t))
        return out
    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cfg = EditConfig(sessions=6, turns=2, seed=a.seed)
    llm = LLM(a.model)
    eng = llm.engine
    assert eng.spec is not None, "speculation is off for this model"
    steps: list[tuple[int, int, float, float]] = []  # (rows, context, measured s, predicted s)
    run = eng.runner.run

    def runner(batch: Any) -> Any:
        t = time.perf_counter()
        out = run(batch)
        dt = time.perf_counter() - t
        req, n = batch.requests[0], batch.num_tokens[0]
        if len(batch) == 1 and batch.samples(0) and n == 1 + len(batch.draft(0)):  # a decode or verify step
            c, ctx = eng.spec.cost, req.num_computed_tokens + n
            steps.append((n, ctx, dt, c.base + c.request(ctx, n)))
        return out

    eng.runner.run = runner
    around: dict[str, list[tuple[int, float]]] = defaultdict(list)
    eng.spec.draft = timed(eng.spec.draft, around["draft"], lambda batch, *_: sum(batch.num_tokens))
    eng.postprocess = timed(eng.postprocess, around["postprocess"], lambda batch, *_: sum(batch.num_tokens))
    turns = [t for s in generate_edit(cfg) for t in s if t.kind in ("code", "json")][: a.turns]
    for t in turns:
        ids = llm.tokenizer.encode(llm.tokenizer.apply_chat_template(t.messages, add_generation_prompt=True))
        llm.generate([ids], SamplingParams(max_tokens=reply_cap(cfg), temperature=0.0))
    c = eng.spec.cost
    print(f"StepCost: base {c.base * 1e3:.2f} ms, {c.per_row * 1e3:.2f} ms a row, {c.per_token * 1e6:.2f} ms a request "
          f"per 1k tokens of context, +{c.per_token_extra * 1e6:.2f} a further row")
    for lo, hi in BUCKETS:
        b = [s for s in steps if lo <= s[0] <= hi]
        if b:
            print(f"{lo}-{hi} rows: {len(b)} steps, context {statistics.mean(s[1] for s in b):.0f}, measured "
                  f"{statistics.median(s[2] for s in b) * 1e3:.2f} ms, predicted {statistics.median(s[3] for s in b) * 1e3:.2f} ms")
    for name, calls in around.items():
        for lo, hi in BUCKETS:
            xs = [dt for n, dt in calls if lo <= n <= hi]
            if xs:
                print(f"{name}, {lo}-{hi} rows: {len(xs)} calls, median {statistics.median(xs) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
