"""PrefillProgress: a rank's unanswered prefill priced as what its speed has not done yet."""
from __future__ import annotations

from kvstrata.router.prefill_progress import MAX_STEP, PrefillProgress


def test_the_queue_counts_whole_until_the_rank_has_answered_a_large_prefill() -> None:
    p = PrefillProgress()
    p.sent(1, 4000, now=0.0)
    assert p.remaining(9.0) == 4000  # no speed known yet
    p.sent(2, 100, now=1.0)
    p.answered(2, 100, now=1.5)  # too small to time a prefill
    assert p.tokens_per_s == 0.0 and p.remaining(9.0) == 4000
    p.answered(1, 4000, now=10.0)
    assert p.tokens_per_s == 400.0 and p.tokens == 0 and p.remaining(10.0) == 0


def test_a_prefill_under_way_is_priced_as_its_part_not_done() -> None:
    p = PrefillProgress(tokens_per_s=400.0)
    p.sent(1, 4000, now=0.0)
    p.sent(2, 800, now=3.0)  # queued behind it: the work since the oldest send counts against both
    assert p.remaining(0.0) == 4800
    assert p.remaining(9.0) == 4800 - 3600
    assert p.remaining(20.0) == 0
    p.answered(1, 4000, now=10.0)
    assert p.remaining(10.0) == 0  # the one left was sent at 3.0: 2,800 tokens done since


def test_answers_that_time_no_prefill_teach_nothing_and_one_sample_moves_the_speed_a_bounded_step() -> None:
    p = PrefillProgress(tokens_per_s=400.0)
    p.sent(1, 4000, now=0.0)
    p.answered(1, 4000, now=0.01, learn=False)  # an error answer: no sample
    assert p.tokens_per_s == 400.0 and p.tokens == 0
    p.sent(2, 4000, now=0.0)
    p.answered(2, 4000, now=0.001)  # a response-cache hit looks like 4M tokens/s
    assert p.tokens_per_s == 0.3 * MAX_STEP * 400.0 + 0.7 * 400.0
