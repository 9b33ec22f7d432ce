"""Next-token sampling: greedy rows in one argmax, sampled rows each with their own generator.

A request with a seed owns a torch.Generator seeded once, on the logits' device (a CUDA draw needs a
CUDA generator), so the same seed gives the same output no matter which other requests share its
batch (and across a preemption: recompute samples nothing). The tokens stay on the device until one
`tolist()` for the whole step: no host sync per row.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvstrata.config import GREEDY_BELOW


@dataclass
class SampleSpec:
    temperature: float
    top_p: float
    top_k: int
    generator: torch.Generator | None


def multinomial_sample_one_no_sync(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Gumbel-style draw: argmax(p / Exp(1)) samples from p (unnormalised is fine) without
    torch.multinomial's sync; returns a 0-dim index tensor on probs' device.

    Exp(1) noise as -log(U), U ~ Uniform[0, 1): 5x faster on CPU than `exponential_` over a 49k
    vocabulary (0.19 vs 0.93 ms a draw). U == 0 gives infinite noise, so that token is not drawn
    (never the reverse: no token is forced by zero noise)."""
    noise = torch.rand(probs.shape, generator=generator, dtype=probs.dtype, device=probs.device)
    return torch.argmax(probs / noise.log_().neg_())


def sample_row(logits: torch.Tensor, spec: SampleSpec) -> torch.Tensor:
    """logits [V] -> 0-dim token id tensor, drawn from softmax(logits / T) after top-k then top-p.

    Works in the sorted candidate space: top-k's values come sorted, top-p sorts once; one softmax
    serves top-p's cut and the draw (the draw needs no renormalisation after the cut)."""
    scaled = logits / spec.temperature
    order: torch.Tensor | None = None
    if 0 < spec.top_k < scaled.shape[-1]:
        scaled, order = torch.topk(scaled, spec.top_k)  # sorted descending
    elif spec.top_p < 1.0:
        scaled, order = torch.sort(scaled, descending=True)
    probs = scaled.softmax(-1)
    if spec.top_p < 1.0:
        # drop a candidate once the mass before it reaches top_p (the one that crosses it stays)
        probs = probs.masked_fill(probs.cumsum(-1) - probs >= spec.top_p, 0.0)
    choice = multinomial_sample_one_no_sync(probs, spec.generator)
    # gather, not order[choice]: indexing with a 0-dim tensor reads it on the host (a sync)
    return choice if order is None else order.gather(0, choice.view(1)).view(())


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
