"""apply_penalties against a plain per-row, per-token reference, over random batches that mix penalized and
plain rows, histories of any length (empty too), and biases on tokens the histories hold or not."""
from __future__ import annotations

import random

import torch

from kvstrata.model.penalties import PenaltyRow, apply_penalties

V = 97


def reference(x: torch.Tensor, r: PenaltyRow, prompt: list[int]) -> torch.Tensor:
    x = x.clone()
    for tok, bias in r.bias:
        x[tok] += bias
    if r.repetition != 1.0:
        for tok in set(prompt) | set(r.output):
            x[tok] = x[tok] / r.repetition if x[tok] > 0 else x[tok] * r.repetition
    for tok in set(r.output):
        x[tok] -= r.frequency * r.output.count(tok) + r.presence
    return x


def random_row(rng: random.Random, row: int) -> tuple[PenaltyRow, list[int]]:
    prompt = [rng.randrange(V) for _ in range(rng.randint(1, 40))]
    mask = torch.zeros(V, dtype=torch.bool)
    mask[prompt] = True
    out = [rng.randrange(V) for _ in range(rng.choice([0, 1, 5, 60]))]
    bias = tuple(sorted({rng.randrange(V): rng.uniform(-100, 100) for _ in range(rng.randint(0, 4))}.items()))
    rep = rng.choice([1.0, 0.5, 1.3, 2.0])
    return PenaltyRow(row, out, mask if rep != 1.0 else None, rng.choice([0.0, -1.2, 0.7]),
                      rng.choice([0.0, 0.4, -2.0]), rep, bias), prompt


def test_random_batches_match_the_reference() -> None:
    rng = random.Random(0)
    for _ in range(200):
        S = rng.randint(1, 9)
        logits = torch.randn(S, V) * 4
        chosen = sorted(rng.sample(range(S), rng.randint(0, S)))
        rows = [random_row(rng, i) for i in chosen]
        want = logits.clone()
        for r, prompt in rows:
            want[r.row] = reference(logits[r.row], r, prompt)
        got = logits.clone()
        apply_penalties(got, [r for r, _ in rows])
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)  # rows not named are untouched: exactly


def test_repetition_divides_positive_and_multiplies_negative_logits() -> None:
    logits = torch.tensor([[2.0, -2.0, 0.0, 3.0]])
    mask = torch.tensor([True, True, True, False])
    apply_penalties(logits, [PenaltyRow(0, [], mask, repetition=2.0)])
    assert logits.tolist() == [[1.0, -4.0, 0.0, 3.0]]


def test_presence_and_frequency_count_the_output_only() -> None:
    logits = torch.zeros(1, 4)
    apply_penalties(logits, [PenaltyRow(0, [1, 1, 3], torch.tensor([True] * 4), presence=0.5, frequency=0.25)])
    assert logits.tolist() == [[0.0, -1.0, 0.0, -0.75]]
