"""The sampler draws from the filtered softmax: frequencies match, filters exclude, seeds repeat."""
from __future__ import annotations

import torch

from kvstrata.model.sampler import SampleSpec, multinomial_sample_one_no_sync, sample


def test_draw_frequencies_match_probabilities() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    gen = torch.Generator().manual_seed(0)
    n = 20000
    counts = torch.bincount(torch.tensor([multinomial_sample_one_no_sync(probs, gen) for _ in range(n)]), minlength=5)
    freq = counts.float() / n
    assert counts[4] == 0  # a zero-probability token is never drawn
    # 4 standard deviations of a binomial proportion at n = 20000 is < 0.015
    assert torch.allclose(freq[:4], probs[:4], atol=0.015), freq


def test_top_k_top_p_and_greedy() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]] * 3)
    gen = torch.Generator().manual_seed(1)
    seen: set[int] = set()
    for _ in range(300):
        greedy, top2, nucleus = sample(logits, [SampleSpec(0.0, 1.0, 0, None), SampleSpec(1.0, 1.0, 2, gen),
                                                SampleSpec(1.0, 0.5, 0, gen)])
        assert greedy == 0 and top2 in (0, 1) and nucleus == 0  # p(token 0) = 0.64 >= top_p alone
        seen.add(top2)
    assert seen == {0, 1}


def test_same_seed_same_draws() -> None:
    probs = torch.softmax(torch.randn(1000), -1)
    runs = []
    for _ in range(2):
        gen = torch.Generator().manual_seed(7)
        runs.append([multinomial_sample_one_no_sync(probs, gen) for _ in range(8)])
    assert runs[0] == runs[1] and len(set(runs[0])) > 1  # repeatable, and the generator advances
