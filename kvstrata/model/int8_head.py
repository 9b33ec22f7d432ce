"""The LM head in 8 bits, for the same narrow (decode) steps that run the GGUF's 4-bit linears.

SmolLM2's LM head is its tied embedding, 49,152 x 576: 113 MB in float32, read in full at every
decode step. With the linears on 4-bit weights (q4_weights.py) it was the largest single read of a
batch-1 step. Here it is held as int8 with one scale per output row (symmetric, max |w| / 127),
and run by torch's CPU kernel `aten._weight_int8pack_mm(x, w_int8, scales)`, which is fast with
bf16 activations only (1 row on a 2-core AVX2 EPYC, one thread: 5.5 ms vs 10.3 ms for the float32
head; with float32 activations it took 26 ms), so activations are cast around it as for the int4 kernel.
The GGUF ships this tensor as Q8_0 (blocks of 32 with their own scale): one scale per row instead
is a second rounding: at most half a step of max |w_row| / 127 per weight, plus at most half a
step from holding the scales in bf16 (the kernel's dtype). That error, with the bf16 activations,
reorders near-tied tokens, so each row's top `RESCORE_TOP` logits are recomputed from the dense
head (a 32 x 576 gather: microseconds). Logits stay float32.
Prefill and wide steps keep the dense head (LlamaModel picks per step, as for the linears).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

KERNEL_DTYPE = torch.bfloat16
# logits recomputed exactly per row: the int8 error (rounded weights and scales, bf16 activations)
# reorders near-tied candidates; measured on SmolLM2, 24 prompts x 32 greedy tokens agreed with the
# float32 head's output 7 times without rescoring, 17 with it (= the int4 linears alone)
RESCORE_TOP = 32


@dataclass
class Int8Head:
    weight: torch.Tensor  # [V, hidden] int8
    scales: torch.Tensor  # [V] in KERNEL_DTYPE

    @classmethod
    def quantize(cls, dense: torch.Tensor) -> Int8Head:
        """Per-row symmetric int8 of `dense` [V, hidden] (any float dtype)."""
        w = dense.float()
        scales = (w.abs().amax(dim=1) / 127.0).clamp(min=torch.finfo(torch.float32).tiny)
        q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        return cls(q, scales.to(KERNEL_DTYPE))

    def approx_logits(self, x: torch.Tensor) -> torch.Tensor:  # x [S, hidden] -> [S, V] float32
        return torch.ops.aten._weight_int8pack_mm(x.to(KERNEL_DTYPE), self.weight, self.scales).float()

    def logits(self, x: torch.Tensor, dense: torch.Tensor, rescore: int = RESCORE_TOP) -> torch.Tensor:
        """[S, V] float32: the int8 logits, with each row's `rescore` largest recomputed exactly from
        `dense` [V, hidden] and `x` as given (no bf16 rounding): greedy picks the dense head's argmax
        whenever it is among the int8 top `rescore`, and sampling sees exact values where its mass is."""
        out = self.approx_logits(x)
        top = out.topk(min(rescore, out.shape[1]), dim=-1).indices  # [S, k]
        exact = torch.bmm(dense[top].float(), x.float().unsqueeze(-1)).squeeze(-1)  # [S, k]
        return out.scatter_(1, top, exact)


def int8_head_supported() -> bool:
    return hasattr(torch.ops.aten, "_weight_int8pack_mm")
