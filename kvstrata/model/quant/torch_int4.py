"""Q4_0/Q4_1 linears on torch's own CPU int4 kernel, for CPUs where our integer-dot kernels have no
vector form (or with `--fused-ops off`).

`aten._weight_int4pack_mm_for_cpu(x, packed, 32, scale_and_zero)` computes x @ ((q - 8) * scale + zero).T
group by group, which holds a GGUF Q4 block losslessly: with w = scale * q + bias (blocks.py),
zero = bias + 8 scale (then held in bf16, a rounding of the block constants). The kernel is vectorized
for bf16 activations only (with float32 ones it ran ~200x slower), so a float32 model casts its
activations around it. Wider steps keep the dense weights.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvstrata.model.quant.blocks import IntWeight

GROUP = 32
KERNEL_DTYPE = torch.bfloat16  # activations the kernel is fast with, whatever the model's dtype


@dataclass
class TorchInt4:
    packed: torch.Tensor  # from aten._convert_weight_to_int4pack_for_cpu
    scale_zero: torch.Tensor  # [K / 32, N, 2] in KERNEL_DTYPE
    out_features: int

    @staticmethod
    def accepts(w: IntWeight) -> bool:
        return w.bits == 4 and w.group == GROUP and w.q.shape[1] % GROUP == 0

    @classmethod
    def of(cls, parts: list[IntWeight]) -> TorchInt4:
        """The row-concatenation of `parts` (a fused qkv or gate_up), each accepted by `accepts`."""
        q = torch.cat([p.q for p in parts]).to(torch.int32)  # [N, K]
        scale = torch.cat([p.scale for p in parts])  # [N, K / 32]
        zero = torch.cat([p.bias + 8 * p.scale for p in parts])
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        scale_zero = torch.stack([scale.t(), zero.t()], dim=-1).to(KERNEL_DTYPE).contiguous()
        return cls(packed, scale_zero, q.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x [T, K] -> [T, N] in x's dtype
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(KERNEL_DTYPE), self.packed, GROUP, self.scale_zero)
        return out.to(x.dtype)


def torch_int4_supported() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")
