"""Start-up warm-up: a dummy step of the whole step budget before the server says it is ready (glibc
malloc's tuning, its companion, is malloc_tuning.py).

Why: the first cold prompt after start pays for a fresh heap and the first use of the GEMM and
attention kernels at its size (tens of thousands of minor page faults), and with glibc's defaults
(an mmap threshold that adapts, the heap top trimmed above twice it) later cold prompts keep
faulting in the large blocks a step frees. The dummy step moves the first-use cost before /health
says ready, and the two thresholds below keep the freed memory mapped; vLLM runs a dummy batch of
max_num_batched_tokens at start for the same reason (its profile run). Figures: docs/production.md,
"Start-up warm-up".

The dummy step goes through the runner and the model only: pages straight from the pool (given back
zeroed), no request, no prefix cache, no KV events, no store writes, no metrics.
"""
from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from kvstrata.engine.runner import ModelRunner, slot_range
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.engine.scheduler import ScheduledBatch
from kvstrata.kv.pool import PagePool

log = logging.getLogger(__name__)

DECODE_ROWS = 8  # decode rows in the dummy decode step (first use of the decode kernels)


@dataclass(frozen=True)
class WarmupReport:
    prefill_tokens: int
    decode_rows: int
    seconds: float


PLAIN = SamplingParams()  # a dummy request scores nothing


def fake_request(token_ids: list[int], computed: int, pages: list[int]) -> Any:
    """What ModelRunner.prepare and ScheduledBatch.samples read of a Request, and nothing else."""
    return SimpleNamespace(token_ids=token_ids, num_computed_tokens=computed, num_tokens=len(token_ids), pages=pages,
                           num_prompt_tokens=len(token_ids), params=PLAIN)


def zero_pages(pool: PagePool, pages: list[int]) -> None:
    """Zero the K/V of `pages` before they go back: no page leaves a dummy step with its K/V in it."""
    ps = pool.page_size
    slots = torch.tensor(list(slot_range(pages, 0, len(pages) * ps, ps)), device=pool.k[0].device)
    for k, v in zip(pool.k, pool.v):
        k.index_fill_(0, slots, 0)
        v.index_fill_(0, slots, 0)


def warm_up(runner: ModelRunner, num_tokens: int, max_model_len: int, vocab_size: int, max_rows: int) -> WarmupReport:
    """Engine thread, before any request (Engine.warm_up): one prefill step of `num_tokens` dummy
    tokens (capped by the context limit and the free pages), then one decode step of up to
    min(DECODE_ROWS, max_rows) rows over it. Leaves the pool as it found it (pages zeroed, freed)."""
    t0 = time.monotonic()
    pool = runner.pool
    ps = pool.page_size
    n = min(num_tokens, max_model_len - 1, pool.num_free * ps - 1)
    if n < 2:
        return WarmupReport(0, 0, 0.0)
    pages = pool.alloc(-(-(n + 1) // ps))
    assert pages is not None  # n fits the free pages by construction
    rng = random.Random(0)
    ids = [rng.randrange(vocab_size) for _ in range(n + 1)]
    rows = min(DECODE_ROWS, max(1, max_rows))
    try:
        with torch.inference_mode():
            for batch in (
                ScheduledBatch([fake_request(ids[:n], 0, pages)], [n]),
                ScheduledBatch([fake_request(ids, n, pages) for _ in range(rows)], [1] * rows),
            ):
                input_ids, positions, meta, logit_rows = runner.prepare(batch)
                runner.model.forward(input_ids, positions, meta, pool.k, pool.v, logit_rows)
            zero_pages(pool, pages)
    finally:
        pool.free(pages)
    report = WarmupReport(n, rows, time.monotonic() - t0)
    log.info("warm-up: one %d-token prefill step and a %d-row decode step in %.2f s", n, rows, report.seconds)
    return report
