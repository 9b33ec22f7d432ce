"""Next-token sampling: greedy rows in one argmax, sampled rows each with their own generator.

A request with a seed owns a torch.Generator seeded once, on the logits' device (a CUDA draw needs a
CUDA generator), so the same seed gives the same output no matter which other requests share its
batch (and across a preemption: recompute samples nothing). The tokens stay on the device until one
`tolist()` for the whole step: no host sync per row.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvstrata.config import GREEDY_BELOW


@dataclass
class SampleSpec:
    temperature: float
    top_p: float
    top_k: int
    generator: torch.Generator | None
    min_p: float = 0.0


def multinomial_sample_one_no_sync(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Gumbel-style draw: argmax(p / Exp(1)) samples from p (unnormalised is fine) without
    torch.multinomial's sync; returns a 0-dim index tensor on probs' device.

    Exp(1) noise as -log(U), U ~ Uniform[0, 1): 5x faster on CPU than `exponential_` over a 49k
    vocabulary (0.19 vs 0.93 ms a draw). U == 0 gives infinite noise, so that token is not drawn
    (never the reverse: no token is forced by zero noise)."""
    noise = torch.rand(probs.shape, generator=generator, dtype=probs.dtype, device=probs.device)
    return torch.argmax(probs / noise.log_().neg_())


# top-p without a full sort: the nucleus almost always lies in the top 1024 of a 49k vocabulary
TOP_P_CANDIDATES = 1024


def _nucleus_candidates(scaled: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, ids) sorted descending, holding every token top-p can keep. On CPU, a top-k of
    TOP_P_CANDIDATES when those already hold more than top_p of the mass (checked on the host, which
    is free on CPU); else, and on other devices (their sort is fast), a full sort. A full sort of a
    49k vocabulary costs ~6 ms a row on the AVX2 CPU."""
    if scaled.device.type == "cpu" and scaled.shape[-1] > TOP_P_CANDIDATES:
        vals, ids = torch.topk(scaled, TOP_P_CANDIDATES)
        if float(torch.exp(vals - torch.logsumexp(scaled, -1)).sum()) > top_p + 1e-4:
            return vals, ids
    return torch.sort(scaled, descending=True)


def filtered_probs(logits: torch.Tensor, spec: SampleSpec) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [V] -> (unnormalised probabilities of the candidates, their token ids or None = all),
    for softmax(logits / T) after min-p, then top-k, then top-p (renormalised over what top-k kept).
    min-p drops p < min_p * p_max, i.e. a scaled logit more than -log(min_p) below the largest."""
    scaled = logits / spec.temperature
    if spec.min_p > 0.0:
        scaled = scaled.masked_fill(scaled < scaled.max() + math.log(spec.min_p), float("-inf"))
    ids: torch.Tensor | None = None
    if 0 < spec.top_k < scaled.shape[-1]:
        scaled, ids = torch.topk(scaled, spec.top_k)  # sorted descending
        lse = torch.logsumexp(scaled, -1)
    elif spec.top_p < 1.0:
        lse = torch.logsumexp(scaled, -1)
        scaled, ids = _nucleus_candidates(scaled, spec.top_p)
    else:
        return scaled.softmax(-1), None
    probs = torch.exp(scaled - lse)  # one softmax serves the cut and the draw
    if spec.top_p < 1.0:
        # drop a candidate once the mass before it reaches top_p (the one that crosses it stays)
        probs = probs.masked_fill(probs.cumsum(-1) - probs >= spec.top_p, 0.0)
    return probs, ids


def sample_row(logits: torch.Tensor, spec: SampleSpec) -> torch.Tensor:
    """logits [V] -> 0-dim token id tensor (the draw needs no renormalisation after the cut)."""
    probs, ids = filtered_probs(logits, spec)
    choice = multinomial_sample_one_no_sync(probs, spec.generator)
    # gather, not ids[choice]: indexing with a 0-dim tensor reads it on the host (a sync)
    return choice if ids is None else ids.gather(0, choice.view(1)).view(())


def sample_tensor(logits: torch.Tensor, specs: list[SampleSpec]) -> torch.Tensor:
    """logits: [S, V] float32, one row per spec -> [S] long token ids on logits' device."""
    out = torch.argmax(logits, dim=-1)
    for row, spec in enumerate(specs):
        if spec.temperature >= GREEDY_BELOW:
            out[row] = sample_row(logits[row], spec)
    return out


def sample(logits: torch.Tensor, specs: list[SampleSpec]) -> list[int]:
    """logits: [S, V] float32, one row per spec; one host sync for the whole step."""
    return sample_tensor(logits, specs).tolist()
