"""Verifying a draft (kvstrata/engine/spec/verify.py): greedy keeps the model's argmax; sampled rows keep
the model's distribution (chi-square over many draws) and draw what plain decoding draws."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from kvstrata.engine.spec.verify import accept
from kvstrata.model.sampler import SampleSpec, sample_row

V = 6


def greedy_spec() -> SampleSpec:
    return SampleSpec(0.0, 1.0, 0, None)


def rows(*argmaxes: int) -> torch.Tensor:
    out = torch.zeros(len(argmaxes), V)
    for i, t in enumerate(argmaxes):
        out[i, t] = 5.0
    return out


def test_greedy_accepts_the_matching_prefix_then_the_models_token() -> None:
    assert accept(rows(1, 2, 3, 4), [1, 2, 3], greedy_spec()) == [1, 2, 3, 4]  # all accepted + the next
    assert accept(rows(1, 5, 3, 4), [1, 2, 3], greedy_spec()) == [1, 5]  # the model's token at the mismatch
    assert accept(rows(0, 2, 3, 4), [1, 2, 3], greedy_spec()) == [0]
    assert accept(rows(3), [], greedy_spec()) == [3]


def test_the_rows_must_cover_the_draft() -> None:
    with pytest.raises(ValueError, match="rows of logits"):
        accept(rows(1, 2), [1, 2], greedy_spec())


def chi_square(counts: Counter[int], probs: torch.Tensor, n: int) -> float:
    return sum((counts.get(t, 0) - n * float(p)) ** 2 / (n * float(p)) for t, p in enumerate(probs) if p > 0)


@pytest.mark.parametrize("draft_token", [0, 3, 5])  # likely, middling and unlikely drafts
def test_sampled_rows_keep_the_models_distribution(draft_token: int) -> None:
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -1.0], [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]])
    p0 = logits[0].softmax(-1)
    n = 4000
    gen = torch.Generator().manual_seed(1)
    spec = SampleSpec(1.0, 1.0, 0, gen)
    first: Counter[int] = Counter()
    accepted = 0
    for _ in range(n):
        out = accept(logits, [draft_token], spec)
        first[out[0]] += 1
        accepted += out[0] == draft_token and len(out) == 2
    # 5 degrees of freedom: 20.5 is the 0.1% tail; a draft that biased the output would be far above
    assert chi_square(first, p0, n) < 20.5, first
    assert abs(accepted / n - float(p0[draft_token])) < 0.03  # accepted with the model's probability


def test_sampled_rows_draw_what_plain_decoding_draws() -> None:
    """With the same generator, a verify step emits the tokens decoding would emit one by one."""
    torch.manual_seed(0)
    logits = torch.randn(4, V) * 2
    spec_args = (0.8, 0.9, 0)
    for seed in range(50):
        plain = SampleSpec(*spec_args, torch.Generator().manual_seed(seed))
        expected = [int(sample_row(logits[i], plain)) for i in range(4)]
        draft = expected[:3] if seed % 2 else [expected[0], (expected[1] + 1) % V, expected[2]]
        got = accept(logits, draft, SampleSpec(*spec_args, torch.Generator().manual_seed(seed)))
        assert got == (expected if seed % 2 else expected[:2])
