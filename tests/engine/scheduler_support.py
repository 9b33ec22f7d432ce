"""The scheduler tests' engine and prompts: an offline LLM on the tiny random-weight model, float32, and
seeded random token-id prompts (test_scheduler.py, test_scheduling_order.py)."""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from kvstrata.engine.llm import LLM
from kvstrata.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def make(tiny_model_dir: Path, **kw: Any) -> LLM:
    kw.setdefault("dtype", "float32")
    kw.setdefault("max_total_tokens", 4096)
    return LLM(str(tiny_model_dir), **kw)


def prompts(n: int, lo: int = 5, hi: int = 120, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 49000) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
