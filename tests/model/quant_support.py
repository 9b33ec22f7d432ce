"""Quantized weights for the model tests: random GGUF blocks of every type the integer-dot kernels run
(kvstrata/bench/synth/random_blocks.py), and a model's linears quantized for real."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from kvstrata.bench.synth.random_blocks import random_blocks
from kvstrata.model.quant.blocks import IntWeight, decode_blocks
from kvstrata.model.quant.int_dot import pack

def random_raw(type_name: str, n: int, k: int, seed: int = 0, scale: float = 0.01) -> np.ndarray:
    """[n, bytes a row] of random `type_name` blocks for an [n, k] weight (kvstrata's synth-model generator)."""
    return random_blocks(type_name, n, k, np.random.default_rng(seed), scale)


def quantize_linears(tensors: dict[str, torch.Tensor], kind: Callable[[str], str]) -> tuple[
        dict[str, torch.Tensor], dict[str, IntWeight], dict[str, torch.Tensor]]:
    """A model's linears quantized by the `gguf` package to the type `kind(name)` names (Q4_0/1, Q5_0/1,
    Q8_0): (int-dot tiles, the blocks as IntWeights, the dense tensors with each linear replaced by its
    quantized values, so a dense model and a quantized one hold the same weights)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    tiles: dict[str, torch.Tensor] = {}
    blocks: dict[str, IntWeight] = {}
    dense = dict(tensors)
    for name, t in tensors.items():
        if not name.endswith("proj.weight"):
            continue
        qtype = GGMLQuantizationType[kind(name)]
        raw = quantize(t.float().numpy(), qtype)
        blocks[name] = decode_blocks(raw, qtype.name, tuple(t.shape))
        tiles[name] = pack(blocks[name])
        dense[name] = torch.from_numpy(dequantize(raw, qtype).astype(np.float32).reshape(t.shape))
    return tiles, blocks, dense
