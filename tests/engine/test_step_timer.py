"""The step timer's fit, fed made-up step times (no clock is read)."""
from __future__ import annotations

import random

import pytest

from kvstrata.engine.step_timer import MIN_PREFILL_STEPS, StepShape, StepTimer, chunk_pairs

TRUE = (0.004, 0.002, 0.0008, 2e-8, 3e-7)  # base, a row, a prompt token, a token pair, a decode context token


def seconds(shape: StepShape, coef: tuple[float, ...] = TRUE) -> float:
    return (coef[0] + coef[1] * shape.rows + coef[2] * shape.prefill_tokens + coef[3] * shape.prefill_pairs
            + coef[4] * shape.decode_context)


def random_shape(rng: random.Random) -> StepShape:
    rows = rng.randint(0, 16)
    tokens = rng.choice([0, 0, rng.randint(32, 2048)])
    start = rng.randint(0, 8000)
    return StepShape(rows, tokens, chunk_pairs(start, tokens), rows * rng.randint(100, 12000))


def test_not_ready_until_it_has_seen_prefill_steps() -> None:
    timer = StepTimer()
    assert not timer.ready and timer.predict(StepShape(rows=4)) == 0.0
    assert timer.prefill_tokens_within(1.0, 0) == 0
    for _ in range(20):  # decode steps alone say nothing about prompts
        timer.observe(StepShape(rows=4, decode_context=4000), 0.02)
    assert not timer.ready
    for i in range(MIN_PREFILL_STEPS):
        shape = StepShape(rows=2, prefill_tokens=512 + i, prefill_pairs=chunk_pairs(0, 512 + i))
        timer.observe(shape, seconds(shape))
    assert timer.ready


def test_fit_recovers_the_step_cost() -> None:
    rng = random.Random(0)
    timer = StepTimer()
    shapes = [random_shape(rng) for _ in range(200)]
    for shape in shapes:
        timer.observe(shape, seconds(shape))
    for shape in shapes[-20:]:
        assert timer.predict(shape) == pytest.approx(seconds(shape), rel=0.02, abs=1e-4)
    assert timer.prefill_seconds(1000, 256) == pytest.approx(TRUE[2] * 256 + TRUE[3] * chunk_pairs(1000, 256), rel=0.02)


def test_a_host_that_slows_down_moves_the_fit() -> None:
    rng = random.Random(1)
    timer = StepTimer()
    for _ in range(100):
        shape = random_shape(rng)
        timer.observe(shape, seconds(shape))
    slow = tuple(2 * c for c in TRUE)
    for _ in range(150):
        shape = random_shape(rng)
        timer.observe(shape, seconds(shape, slow))
    probe = StepShape(rows=4, prefill_tokens=512, prefill_pairs=chunk_pairs(2000, 512), decode_context=8000)
    assert timer.predict(probe) == pytest.approx(seconds(probe, slow), rel=0.05)


def test_tokens_within_inverts_prefill_seconds() -> None:
    timer = StepTimer()
    timer.set_coefficients(TRUE)
    for context in (0, 1000, 20000):
        n = timer.prefill_tokens_within(0.15, context)
        assert timer.prefill_seconds(context, n) <= 0.15 < timer.prefill_seconds(context, n + 1)
    assert timer.prefill_tokens_within(0.15, 20000) < timer.prefill_tokens_within(0.15, 0)  # attention grows
    timer.set_coefficients((0.0, 0.0, 0.001, 0.0, 0.0))
    assert timer.prefill_tokens_within(0.18, 5000) == 180
