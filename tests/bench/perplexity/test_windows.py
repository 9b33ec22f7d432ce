"""The windowing and scoring rule of `kvstrata bench perplexity` (llama-perplexity's), on cases worked by hand."""
from __future__ import annotations

import math

import pytest

from kvstrata.bench.perplexity.windows import Perplexity, cut_windows, scored_positions, window_nlls


def test_windows_are_back_to_back_the_tail_dropped_and_the_bos_written_over_each_first_token() -> None:
    ids = list(range(10, 21))  # 11 tokens: two windows of 5, one token left over
    assert cut_windows(ids, 5, [1]) == [[1, 11, 12, 13, 14], [1, 16, 17, 18, 19]]
    assert cut_windows(ids, 5) == [[10, 11, 12, 13, 14], [15, 16, 17, 18, 19]]
    assert cut_windows(ids, 5, [1], max_windows=1) == [[1, 11, 12, 13, 14]]
    assert cut_windows(ids, 12) == []
    assert ids == list(range(10, 21))  # the caller's ids untouched


def test_only_the_second_half_after_its_first_token_is_scored() -> None:
    assert list(scored_positions(5)) == [3, 4]  # first = 2: the logits at 2 and 3 predict tokens 3 and 4
    assert list(scored_positions(16)) == list(range(9, 16))  # llama-perplexity's n_ctx - first - 1 = 7
    assert len(scored_positions(2048)) == 1023


def test_a_window_by_hand() -> None:
    # ctx 5: prompt tokens 0..4 echoed (the first None), then the generated token's, which is ignored
    echoed = [None, -9.0, -9.0, -0.5, -1.5, -7.0]
    assert window_nlls(echoed, 5) == [0.5, 1.5]
    ppl = Perplexity()
    ppl.add(window_nlls(echoed, 5))
    ppl.add(window_nlls([None, -1.0, -1.0, -1.0, -3.0], 5))  # no generated entry: still a whole window
    # NLLs 0.5, 1.5, 1.0, 3.0: mean 1.5, mean of squares (0.25 + 2.25 + 1 + 9) / 4 = 3.125
    assert (ppl.tokens, ppl.windows) == (4, 2)
    assert ppl.value() == pytest.approx(math.exp(1.5))
    assert ppl.error() == pytest.approx(math.sqrt((3.125 - 1.5 ** 2) / 3) * math.exp(1.5))
    assert ppl.per_window == pytest.approx([math.exp(1.0), math.exp(2.0)])


@pytest.mark.parametrize("echoed", [[None, -1.0, -1.0, -1.0], [None, -1.0, -1.0, None, -1.0],
                                    [None, -1.0, -1.0, -1.0, 0.5], [None, -1.0, -1.0, float("nan"), -1.0]])
def test_an_echo_too_short_or_with_a_missing_or_impossible_log_probability_is_refused(
        echoed: list[float | None]) -> None:
    with pytest.raises(ValueError, match="log-probabilit"):
        window_nlls(echoed, 5)


def test_a_special_prefix_that_reaches_the_scored_half_is_refused() -> None:
    with pytest.raises(ValueError, match="special tokens"):
        cut_windows(list(range(8)), 4, [1, 2, 3])
