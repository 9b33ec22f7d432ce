"""Verify a draft against the model: keep what the model would have produced anyway.

A verify step scores a request's last token and its k drafted tokens in one forward pass: k + 1 rows
of logits, row i the distribution of the token after draft[:i]. Each row is sampled exactly as a
decode step samples it (greedy rows by argmax; sampled rows with the request's own generator, its
temperature, top-k and top-p), in order, and draft[i] is accepted when row i's token equals it. The
first row whose token differs ends the step, its token (the model's, not the draft's) included: so a
step emits accepted + 1 tokens, each drawn from the model's distribution given the tokens before it.

For a draft that proposes one token per position (a point mass, as suffix and n-gram drafts do), this
is the standard rejection rule: accept d with probability min(1, p(d) / q(d)) = p(d), else draw from
the residual max(0, p - q), which is p without d. Sampling then comparing draws the same tokens, and
it draws once per emitted token from the request's generator, as plain decoding does: a seeded request
gives the same tokens with speculation on and off (up to the logits' rounding between step shapes).
"""
from __future__ import annotations

import torch

from kvstrata.config import GREEDY_BELOW
from kvstrata.model.sampler import SampleSpec, sample_row


def accept(logits: torch.Tensor, draft: list[int], spec: SampleSpec, greedy_ids: list[int] | None = None) -> list[int]:
    """logits [len(draft) + 1, V] float32 -> the tokens the step emits: the accepted drafts, then the
    model's token at the first mismatch (or after the whole draft). `greedy_ids`: the rows' argmax,
    already read for the whole step (greedy requests need nothing else)."""
    if logits.shape[0] != len(draft) + 1:
        raise ValueError(f"{logits.shape[0]} rows of logits for a draft of {len(draft)} tokens")
    greedy = spec.temperature < GREEDY_BELOW
    if greedy and greedy_ids is None:
        greedy_ids = torch.argmax(logits, dim=-1).tolist()
    out: list[int] = []
    for i in range(len(draft) + 1):
        tok = greedy_ids[i] if greedy and greedy_ids is not None else int(sample_row(logits[i], spec))
        out.append(tok)
        if i == len(draft) or tok != draft[i]:
            break
    return out
