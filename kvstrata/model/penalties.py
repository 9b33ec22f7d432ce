"""Penalties and logit bias on a step's logits, batched: one set of tensor ops for every penalized row.

The order, as vLLM's sampler applies them (and documented in docs/http-api.md):
1. the grammar's mask (forbidden tokens to -inf; engine/grammar.py);
2. `logit_bias`: added to its tokens' logits;
3. `repetition_penalty` r (transformers' and vLLM's rule): a token seen in the prompt or the output so far
   has its logit divided by r when positive, multiplied by r otherwise;
4. `frequency_penalty` f and `presence_penalty` p (OpenAI's formula, over generated tokens only):
   logit - f * count - p * (count > 0);
5. then the sampler (sampler.py): greedy argmax, or temperature, `min_p`, top-k, top-p and the draw.

Logprobs are taken before all of this (logprobs.py): the model's own distribution, as vLLM's default
`raw_logprobs` mode reports. A verify step's row j is penalized as if decoded one by one: its history is
the output so far plus the first j drafted tokens (`PenaltyRow.output`).
"""
from __future__ import annotations

import itertools
from array import array
from dataclasses import dataclass

import torch


@dataclass
class PenaltyRow:
    """One row of logits to penalize, with what its penalties look at."""

    row: int
    output: list[int]  # tokens generated before this row's token (a verify row: with the drafts before it)
    prompt: torch.Tensor | None  # [V] bool: the prompt's tokens (kept by the request), when repetition_penalty != 1
    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0
    bias: tuple[tuple[int, float], ...] = ()


def _padded(lists: list[list[int]], pad: int) -> torch.Tensor:
    """[len(lists), longest] long, each list padded with `pad` (a scratch column past the vocabulary)."""
    width = max(len(x) for x in lists)
    if width == 0:
        return torch.empty(len(lists), 0, dtype=torch.long)
    flat = array("q", itertools.chain.from_iterable(x + [pad] * (width - len(x)) for x in lists))
    return torch.frombuffer(flat, dtype=torch.long).view(len(lists), width)


def apply_penalties(logits: torch.Tensor, rows: list[PenaltyRow]) -> None:
    """Apply each row's logit bias and penalties to `logits` [S, V] float32, in place (rows not named are
    untouched). Cost: a few [R, V] tensor ops for the R rows named, whatever their histories' lengths."""
    if not rows:
        return
    V, dev = logits.shape[1], logits.device
    index = torch.tensor([r.row for r in rows], device=dev)
    sub = logits.index_select(0, index)
    biased = [(i, t, b) for i, r in enumerate(rows) for t, b in r.bias]
    if biased:
        at, tok, val = zip(*biased)
        sub.index_put_((torch.tensor(at, device=dev), torch.tensor(tok, device=dev)),
                       torch.tensor(val, dtype=sub.dtype, device=dev), accumulate=True)
    counts = torch.zeros(len(rows), V + 1, dtype=sub.dtype, device=dev)  # column V: padding, dropped
    ids = _padded([r.output for r in rows], V).to(dev)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=sub.dtype))
    counts = counts[:, :V]
    seen = counts > 0
    if any(r.repetition != 1.0 for r in rows):
        none = torch.zeros(V, dtype=torch.bool, device=dev)
        in_prompt = torch.stack([r.prompt if r.prompt is not None and r.repetition != 1.0 else none for r in rows])
        rep = torch.tensor([r.repetition for r in rows], dtype=sub.dtype, device=dev)[:, None]
        sub = torch.where(seen | in_prompt, torch.where(sub > 0, sub / rep, sub * rep), sub)
    if any(r.frequency or r.presence for r in rows):
        freq = torch.tensor([r.frequency for r in rows], dtype=sub.dtype, device=dev)[:, None]
        pres = torch.tensor([r.presence for r in rows], dtype=sub.dtype, device=dev)[:, None]
        sub = sub - freq * counts - pres * seen.to(sub.dtype)
    logits.index_copy_(0, index, sub)
