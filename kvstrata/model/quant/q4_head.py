"""The LM head's candidate pass in 4 bits (`--head-bits 4`, the default where the linears take 8-bit
activations: GGUFs 2048 or more wide).

A batch-1 decode step of a 1B model reads its linears' tiles (577 MB for Llama-3.2-1B's shape at Q4_K_M)
and then the whole LM head, 49,152 x 2,048: 96 MB in int8 (int8_head.py), 13% of the step, as much as
llama.cpp reads for the file's Q6_K head. Here the head is held as Q4_0-style blocks (32 weights, 4-bit
values around 8, one float16 scale: 4.5 bits a weight, 57 MB) in the integer-dot kernels' q4s tiles
(int_dot.py) and run by int_dot_linear at 8-bit activations: about half the int8 head's time a row
(docs/cpu-kernels.md). Its logits are only candidates: each row's top `RESCORE_TOP` (a step
with sampled or constrained rows: `WIDE_RESCORE`) are recomputed exactly from the file's rows
(int8_head.rescore_top), so greedy output is the exact head's whenever its argmax is among them (every one
of 768 steps of SmolLM2's real head), and sampling sees exact values where its mass is. Measured on
SmolLM2's head over those 768 steps at temperature 1 (docs/cpu-kernels.md): total variation from the exact
distribution 0.28% mean / 3.8% max with 256 rescored, against 0.30% / 3.2% for the int8 head's 32.
"""
from __future__ import annotations

from typing import Callable

import torch

from kvstrata.model.quant import int_dot
from kvstrata.model.quant.blocks import IntWeight
from kvstrata.model.quant.int8_head import CHUNK_ROWS, RESCORE_TOP, ExactRows, rescore_top

WIDE_RESCORE = 256  # candidates rescored per row in a step with sampled or constrained rows


def q4_blocks(w: torch.Tensor) -> IntWeight:
    """[n, K] float -> Q4_0-style blocks as llama.cpp quantizes them: per 32 weights d = (the weight of
    largest magnitude) / -8, q = trunc(w / d + 8.5) clamped to 0..15, w ~ d (q - 8), d held as float16."""
    n, k = w.shape
    b = w.float().view(n, k // int_dot.GROUP, int_dot.GROUP)
    peak = torch.gather(b, -1, b.abs().argmax(dim=-1, keepdim=True))
    d = peak / -8
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = torch.trunc(b * inverse + 8.5).clamp(0, 15).to(torch.uint8).view(n, k)
    d16 = d.squeeze(-1).half().float()
    return IntWeight(q, d16, -8 * d16, 4, int_dot.GROUP, 8)


def q4_head_packable(vocab: int, hidden: int) -> bool:
    return vocab % int_dot.LANES == 0 and hidden % int_dot.GROUP == 0


class Q4Head:
    def __init__(self, tiles: torch.Tensor) -> None:
        self.tiles = tiles  # [V / 16, hidden / 32, 288] uint8: q4s tiles

    @classmethod
    def from_rows(cls, rows: Callable[[int, int], torch.Tensor], vocab: int, hidden: int) -> Q4Head:
        """From `rows(start, stop)` -> [stop - start, hidden], `CHUNK_ROWS` at a time (no full float copy)."""
        tiles = torch.empty(vocab // int_dot.LANES, hidden // int_dot.GROUP, int_dot.tile_bytes(4, True), dtype=torch.uint8)
        for start in range(0, vocab, CHUNK_ROWS):
            stop = min(vocab, start + CHUNK_ROWS)
            tiles[start // int_dot.LANES:stop // int_dot.LANES] = int_dot.pack(q4_blocks(rows(start, stop)))
        return cls(tiles)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Its tensors by name (converted_cache.py keeps them); `of_tensors` rebuilds it."""
        return {"tiles": self.tiles}

    @classmethod
    def of_tensors(cls, t: dict[str, torch.Tensor]) -> Q4Head:
        return cls(t["tiles"])

    @property
    def nbytes(self) -> int:
        return self.tiles.nbytes

    def approx_logits(self, x: torch.Tensor) -> torch.Tensor:  # x [S, hidden] -> [S, V] float32
        return int_dot.linear(x.float(), [self.tiles], 8)

    def logits(self, x: torch.Tensor, exact: ExactRows, rescore: int = RESCORE_TOP) -> torch.Tensor:
        """[S, V] float32: the 4-bit logits, each row's `rescore` largest recomputed exactly."""
        return rescore_top(self.approx_logits(x), x, exact, rescore)
