"""A layer's four linears (fused q/k/v, o, fused gate/up, down) on quantized weights.

`QuantLinear` runs one of them for a narrow (decode) step: on our integer-dot kernel (int_dot.py), one
call over its parts (the q, k and v weights as the file holds them, each in its own block type: a
Q4_K_M file mixes Q4_K and Q6_K within a layer; the call quantizes the activations once and spreads all
parts' tiles over the threads, so parts cost nothing over one fused weight), or on torch's int4 kernel
(torch_int4.py) where ours has no vector form. `dequantize` gives its dense weight for a wide step where the model
keeps no dense copy (llama.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvstrata.model.quant import int_dot
from kvstrata.model.quant.blocks import IntWeight
from kvstrata.model.quant.torch_int4 import TorchInt4

# HF names of each fused linear's parts, in row order
LINEAR_PARTS = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
                "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}


def part_names(layer: int, linear: str) -> list[str]:
    return [f"model.layers.{layer}.{p}.weight" for p in LINEAR_PARTS[linear]]


@dataclass
class QuantLinear:
    parts: list[torch.Tensor] = field(default_factory=list)  # int-dot tiles [N_p / 16, K / 32, bytes], row order
    torch_int4: TorchInt4 | None = None  # set: torch's int4 kernel runs it instead
    act_bits: int = 16  # the integer activations our kernel multiplies the tiles by (8 or 16; int_dot_linear.cpp)

    @property
    def out_features(self) -> int:
        if self.torch_int4 is not None:
            return self.torch_int4.out_features
        return sum(p.shape[0] for p in self.parts) * int_dot.LANES

    @property
    def in_features(self) -> int:
        return self.parts[0].shape[1] * int_dot.GROUP

    def formats(self) -> list[str]:
        return ["torch_int4"] if self.torch_int4 is not None else [int_dot.format_name(p) for p in self.parts]

    def nbytes(self) -> int:
        if self.torch_int4 is not None:
            return self.torch_int4.packed.nbytes + self.torch_int4.scale_zero.nbytes
        return sum(p.nbytes for p in self.parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x [T, K] -> [T, N] in x's dtype
        if self.torch_int4 is not None:
            return self.torch_int4(x)
        return int_dot.linear(x, self.parts, self.act_bits)

    def dequantize(self, dtype: torch.dtype, out: torch.Tensor | None = None, start: int = 0,
                   stop: int | None = None) -> torch.Tensor:
        """Rows start..stop (default all) of the dense weight [N, K] in `dtype`, into `out` (a buffer of
        at least that many elements) if given."""
        assert self.torch_int4 is None, "torch's int4 path keeps its dense weights"
        stop = self.out_features if stop is None else stop
        n, k = stop - start, self.in_features
        dense = torch.empty(n, k, dtype=dtype) if out is None else out[: n * k].view(n, k)
        first = 0  # the part's first row in the whole weight
        for p in self.parts:
            rows = p.shape[0] * int_dot.LANES
            a, b = max(start, first), min(stop, first + rows)
            if a < b:
                ids = None if (a, b) == (first, first + rows) else torch.arange(a - first, b - first)
                int_dot.dequantize(p, dtype, rows=ids, out=dense[a - start:b - start])
            first += rows
        return dense


def take_tiles(tiles: dict[str, torch.Tensor], names: list[str]) -> QuantLinear | None:
    """One linear of the int-dot tiles `names` (its parts), taken out of `tiles`; None, leaving them,
    unless all are there."""
    if not names or not all(n in tiles for n in names):
        return None
    return QuantLinear(parts=[tiles.pop(n) for n in names])


@dataclass
class LayerLinears:
    qkv: QuantLinear
    o: QuantLinear
    gate_up: QuantLinear
    down: QuantLinear

    def all(self) -> list[QuantLinear]:
        return [self.qkv, self.o, self.gate_up, self.down]

    @classmethod
    def of_tiles(cls, tiles: dict[str, torch.Tensor], layer: int) -> LayerLinears | None:
        """From int-dot tiles by HF name, taken out of `tiles` (the model holds them from here); None,
        leaving them, unless every linear of the layer is there."""
        groups = {name: part_names(layer, name) for name in LINEAR_PARTS}
        if not all(n in tiles for names in groups.values() for n in names):
            return None
        return cls(**{name: QuantLinear(parts=[tiles.pop(n) for n in names]) for name, names in groups.items()})

    @classmethod
    def of_torch_int4(cls, q4: dict[str, IntWeight], layer: int) -> LayerLinears | None:
        """For torch's int4 kernel from Q4 blocks by HF name; None unless every linear of the layer is one."""
        groups = {name: part_names(layer, name) for name in LINEAR_PARTS}
        if not all(n in q4 and TorchInt4.accepts(q4[n]) for names in groups.values() for n in names):
            return None
        return cls(**{name: QuantLinear(torch_int4=TorchInt4.of([q4[n] for n in names])) for name, names in groups.items()})
