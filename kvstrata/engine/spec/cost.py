"""What a step's rows cost, measured on the host: the price a drafted token must beat.

A decode step reads every weight whatever its row count, so the first row pays for the reads and each
further row for its arithmetic; each request's first row also reads its context's K/V, and each further
row of that request (a drafted token) scores the same K/V again (the CPU kernel reads it once for all of
a request's rows, csrc/paged_decode.cpp; other backends read it again):
    step ~ base + sum over rows of per_row + sum over requests of context * (per_token + per_token_extra * (rows - 1))
The four figures depend on the CPU (AVX2 multiplies byte pairs, VNNI four at a time; bf16 is fast
only with avx512_bf16), the model's width, quant type, KV layout and attention backend, so they are timed
here, not assumed: steps of 1 and R rows of one request over a short context and over a long one, in
rounds of the four shapes (the median of each).
The contexts are pages straight from the pool whose K/V is never computed (their zeros cost the same
to read: no prefill runs), given back zeroed, like the warm-up's dummy steps.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

import torch

from kvstrata.engine.runner import ModelRunner
from kvstrata.engine.scheduler import ScheduledBatch
from kvstrata.engine.warmup import fake_request, zero_pages

SHORT, LONG = 16, 1024  # the two contexts (tokens) the steps are timed over
# a 1-row step slower than this (a 7-8B model on 2 cores: ~0.5 s) is timed once per shape, with no untimed
# step per shape: its noise is small beside it, and 3 + 1 steps of each shape took ~10 s of such a start
SLOW_STEP_S = 0.1


@dataclass(frozen=True)
class StepCost:
    """A step's time model, in seconds (the module's formula)."""

    base: float
    per_row: float
    per_token: float  # a request's first row, a token of its context
    per_token_extra: float  # each further row of the request, a token of its context

    def row(self, context: int) -> float:
        """A request's first row over `context` tokens."""
        return self.per_row + self.per_token * context

    def extra_row(self, context: int) -> float:
        """One more row of a request (a drafted token) over `context` tokens."""
        return self.per_row + self.per_token_extra * context

    def request(self, context: int, rows: int) -> float:
        """A request's `rows` rows over `context` tokens: its first row and rows - 1 drafted ones."""
        return self.row(context) + (rows - 1) * self.extra_row(context)


# where the pool cannot hold the timing steps: one more row costs half a 1-row step (drafts need p > 0.5)
FALLBACK = StepCost(base=1.0, per_row=1.0, per_token=0.0, per_token_extra=0.0)


def measure_step_cost(runner: ModelRunner, rows: int, max_context: int, vocab_size: int, repeats: int = 5) -> StepCost:
    """Time steps of 1 and `rows` rows of one request after SHORT tokens and after min(LONG, max_context)
    tokens: `repeats` rounds of the four shapes in turn after one untimed round, the median of each shape
    (where the first 1-row step took over SLOW_STEP_S, one timed round after it); FALLBACK where they do
    not fit. Rounds, not each shape's steps back to back: a shared host's speed can move within seconds,
    and a slow spell that fell on one shape's steps alone moved the fit, and with it which drafts join a
    step (docs/speculative.md)."""
    pool = runner.pool
    ps = pool.page_size
    long = min(LONG, max_context - rows)
    if rows < 2 or long <= 2 * SHORT or -(-(long + rows) // ps) > pool.num_free:
        return FALLBACK
    pages = pool.alloc(-(-(long + rows) // ps))
    assert pages is not None
    rng = random.Random(0)
    ids = [rng.randrange(vocab_size) for _ in range(long + rows)]
    shapes = ((SHORT, 1), (long, 1), (SHORT, rows), (long, rows))
    try:
        with torch.inference_mode():
            def step(context: int, r: int) -> float:
                """The context's next token and r - 1 drafted ones, as a verify step runs them; seconds."""
                batch = ScheduledBatch([fake_request(ids[: context + 1], context, pages)], [r],
                                       {0: ids[context + 1 : context + r]} if r > 1 else {})
                t = time.perf_counter()
                input_ids, positions, meta, logit_rows = runner.prepare(batch)
                runner.model.forward(input_ids, positions, meta, pool.k, pool.v, logit_rows)
                return time.perf_counter() - t

            slow = step(SHORT, 1) > SLOW_STEP_S
            rounds, untimed = (1, 0) if slow else (repeats, 1)
            samples: list[list[float]] = [[] for _ in shapes]
            for n in range(untimed + rounds):
                for i, (context, r) in enumerate(shapes):
                    t = step(context, r)
                    if n >= untimed:
                        samples[i].append(t)
            one, one_long, short, wide = (statistics.median(x) for x in samples)
            zero_pages(pool, pages)
    finally:
        pool.free(pages)
    per_token = max(0.0, (one_long - one) / (long - SHORT))
    per_token_extra = max(0.0, ((wide - short) - (one_long - one)) / ((rows - 1) * (long - SHORT)))
    per_row = max(1e-9, (short - one) / (rows - 1) - per_token_extra * SHORT)
    return StepCost(base=max(0.0, one - per_row - per_token * SHORT), per_row=per_row, per_token=per_token,
                    per_token_extra=per_token_extra)
