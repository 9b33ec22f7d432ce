"""What rows cost a step, offline: verify steps (a request's last token and k drafted ones) and wide decode
batches, on one engine, one run.

    .venv/bin/python bench/verify_rows.py [--model smollm2] [--dtype auto] [--context 1000] [--steps 10]
                                          [--wide 32]

Prints (1) ms per verify step at batch 1 and 4 for k = 0..15 drafted tokens per request, after a
`--context`-token prompt each (the runner's verify rows, engine/spec/); (2) ms per pure decode step at
batch 12, 16, 24 and 32. Each with pure decode steps on the quantized kernels up to `--wide` rows (the
default, engine/model_loader.DECODE_MAX_ROWS) and, alternating in the same process, up to the model's 8
(`LlamaModel.q4_max_rows`: above it the dense linears). Medians of `--steps` timed steps after two untimed.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

sys.path.insert(0, ".")
from kvstrata.engine.llm import LLM  # noqa: E402
from kvstrata.engine.sampling_params import SamplingParams  # noqa: E402


def timed(fn: object, steps: int) -> float:
    ts = []
    for _ in range(steps + 2):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        ts.append(time.perf_counter() - t)
    return statistics.median(ts[2:]) * 1000.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--context", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--wide", type=int, default=32, help="the most rows of a pure decode step on the quantized kernels")
    a = ap.parse_args()
    eng = LLM(a.model, dtype=a.dtype, speculative="off").engine
    rng = random.Random(0)
    params = SamplingParams(max_tokens=4000, temperature=0, ignore_eos=True)

    def start(n: int, tag: str) -> None:
        for j in range(n):
            eng.add_request(f"{tag}{j}", [rng.randrange(100, 20000) for _ in range(a.context)], params)
        while eng.scheduler.waiting or any(r.num_uncomputed > 1 for r in eng.scheduler.running):
            eng.step()

    def stop(n: int, tag: str) -> None:
        for j in range(n):
            eng.abort_request(f"{tag}{j}")

    print(f"model {a.model} dtype {eng.info.dtype} context {a.context}")
    wide, narrow = a.wide, eng.model.q4_max_rows
    for b in (1, 4):
        start(b, f"v{b}-")
        for rows in (wide, narrow):
            eng.model.decode_max_rows = rows
            cells = []
            for k in (0, 1, 3, 5, 7, 11, 15):
                batch = eng.scheduler.schedule()
                for i, req in enumerate(batch.requests):
                    if k:
                        eng.scheduler.kv.allocate(req, 1 + k)
                        batch.drafts[i] = [5] * k
                        batch.num_tokens[i] += k
                cells.append(f"k={k}: {timed(lambda: eng.runner.run(batch), a.steps):.1f}")
                for req in batch.requests:
                    eng.scheduler.kv.trim(req)
            print(f"verify step, batch {b}, quantized up to {rows} rows, ms: " + "  ".join(cells))
        stop(b, f"v{b}-")
    for b in (12, 16, 24, 32):
        start(b, f"d{b}-")
        got = {}
        for rows in (wide, narrow, wide, narrow):
            eng.model.decode_max_rows = rows
            got.setdefault(rows, []).append(timed(eng.step, a.steps))
        print(f"decode batch {b}, ms a step: quantized kernels up to {wide} rows "
              f"{statistics.mean(got[wide]):.1f}, up to {narrow} rows {statistics.mean(got[narrow]):.1f}")
        stop(b, f"d{b}-")


if __name__ == "__main__":
    main()
