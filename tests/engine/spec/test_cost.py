"""What a step's rows cost (kvstrata/engine/spec/cost.py): timed on the engine's own runner without a
prefill, the pool left as it was, a fallback where the pool has no room."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvstrata.engine.llm import LLM
from kvstrata.engine.spec.cost import FALLBACK, LONG, measure_step_cost


def test_the_step_cost_is_timed_and_the_pool_left_clean(tiny_model_dir: Path) -> None:
    eng = LLM(str(tiny_model_dir), dtype="float32", max_total_tokens=2048, speculative="off").engine
    free = eng.pool.num_free
    c = measure_step_cost(eng.runner, rows=8, max_context=4096, vocab_size=eng.info.arch.vocab_size, repeats=2)
    assert c != FALLBACK and c.base >= 0.0 and c.per_row > 0.0 and c.per_token >= 0.0 and c.per_token_extra >= 0.0
    assert c.row(LONG) >= c.row(0) and c.extra_row(LONG) >= c.extra_row(0)
    assert eng.pool.num_free == free
    assert all(float(k.abs().sum()) == 0.0 and float(v.abs().sum()) == 0.0 for k, v in zip(eng.pool.k, eng.pool.v))


def test_no_room_falls_back(tiny_model_dir: Path) -> None:
    eng = LLM(str(tiny_model_dir), dtype="float32", max_total_tokens=64, speculative="off").engine
    vocab = eng.info.arch.vocab_size
    assert measure_step_cost(eng.runner, rows=8, max_context=4096, vocab_size=vocab) == FALLBACK  # the pool
    assert measure_step_cost(eng.runner, rows=1, max_context=4096, vocab_size=vocab) == FALLBACK  # nothing to compare
    big = LLM(str(tiny_model_dir), dtype="float32", max_total_tokens=2048, speculative="off").engine
    assert measure_step_cost(big.runner, rows=8, max_context=40, vocab_size=vocab) == FALLBACK  # the context limit


def test_the_engine_times_it_before_its_first_drafts(tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32", max_total_tokens=2048, speculative="auto")
    assert not llm.engine.spec.measured
    llm.generate([[5, 6, 7] * 10], None)
    assert llm.engine.spec.measured and llm.engine.spec.cost != FALLBACK


def test_a_slow_model_is_timed_once_a_shape(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1-row step over SLOW_STEP_S (an 8B model's ~0.5 s) is timed once per shape after one first step:
    4 steps, not 4 x (repeats + 1), which took ~10 s of an 8B start."""
    from kvstrata.engine.spec import cost

    eng = LLM(str(tiny_model_dir), dtype="float32", max_total_tokens=2048, speculative="off").engine
    steps = 0
    forward = eng.runner.model.forward

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal steps
        steps += 1
        return forward(*args, **kwargs)

    monkeypatch.setattr(eng.runner.model, "forward", counted)
    vocab = eng.info.arch.vocab_size
    assert measure_step_cost(eng.runner, rows=8, max_context=4096, vocab_size=vocab, repeats=3) != FALLBACK
    assert steps == 1 + 4 * (1 + 3)  # the first step, then an untimed round and 3 timed ones of the 4 shapes
    steps = 0
    monkeypatch.setattr(cost, "SLOW_STEP_S", 0.0)
    c = measure_step_cost(eng.runner, rows=8, max_context=4096, vocab_size=vocab, repeats=3)
    assert c != FALLBACK and steps == 5
