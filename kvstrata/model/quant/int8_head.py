"""The LM head in 8 bits, for the narrow (decode) steps that run the GGUF's quantized linears, and for
every step of a model that keeps no dense head.

SmolLM2's LM head is its tied embedding, 49,152 x 576: 113 MB in float32, read in full at every
decode step. With the linears on their quantized blocks (int_dot.py) it was the largest single read of a
batch-1 step. Here it is held as int8 with one scale per output row (symmetric, max |w| / 127),
and run by torch's CPU kernel `aten._weight_int8pack_mm(x, w_int8, scales)`, which is fast with
bf16 activations only (with float32 ones it was slower than the float32 head: docs/cpu-kernels.md), so
activations are cast around it as for the int4 kernel.
The GGUF ships this tensor as Q8_0 (blocks of 32 with their own scale): one scale per row instead
is a second rounding: at most half a step of max |w_row| / 127 per weight, plus at most half a
step from holding the scales in bf16 (the kernel's dtype). That error, with the bf16 activations,
reorders near-tied tokens, so each row's top `RESCORE_TOP` logits are recomputed from the exact
head rows (the dense head, or the GGUF's own rows of it: gguf_rows.py). Logits stay float32.
Where the model keeps a dense head, wide steps use it (LlamaModel picks per step, as for the linears).
On x86 CPUs with AVX512-VNNI or AVX2 (and `--fused-ops auto`), our kernel (csrc/int8_head.cpp) runs
it instead: each weight is read once for all rows, activations quantized per row to int8 (one more
rounding, which the rescoring covers); docs/cpu-kernels.md has its timings.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

import torch

KERNEL_DTYPE = torch.bfloat16
# logits recomputed exactly per row: the int8 error (rounded weights and scales, bf16 activations)
# reorders near-tied candidates; measured on SmolLM2, 24 prompts x 32 greedy tokens agreed with the
# float32 head's output 7 times without rescoring, 17 with it (= the int4 linears alone)
RESCORE_TOP = 32
ExactRows = Union[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]  # the dense head, or ids [n] -> rows [n, hidden]
CHUNK_ROWS = 1024  # head rows quantized at a time when built from a row source (no full float32 copy)


@dataclass
class Int8HeadPack:
    """The int8 head in csrc/int8_head.cpp's layout: blocks of 16 output rows as [hidden/4][16][4]."""

    packed: torch.Tensor  # [V / 16, hidden / 4, 16, 4] int8
    wsum: torch.Tensor  # [V] int32: each row's sum of weights (the kernel's +128 offset correction)
    wscale: torch.Tensor  # [V] float32

    @classmethod
    def of(cls, q: torch.Tensor, scales: torch.Tensor) -> Int8HeadPack:
        V, K = q.shape
        packed = q.view(V // 16, 16, K // 4, 4).permute(0, 2, 1, 3).contiguous()
        wsum = torch.empty(V, dtype=torch.int32)
        for start in range(0, V, CHUNK_ROWS):  # in chunks: summing casts to int32 first (4 bytes a weight)
            wsum[start:start + CHUNK_ROWS] = q[start:start + CHUNK_ROWS].sum(dim=1, dtype=torch.int32)
        return cls(packed, wsum, scales.float().contiguous())


def packable(rows: int, hidden: int) -> bool:
    return rows % 16 == 0 and hidden % 4 == 0


@dataclass
class Int8Head:
    weight: torch.Tensor  # [V, hidden] int8
    scales: torch.Tensor  # [V] in KERNEL_DTYPE
    pack: Int8HeadPack | None = None  # set: logits by csrc/int8_head.cpp (avx512_vnni or avx2 CPUs)

    @classmethod
    def quantize(cls, dense: torch.Tensor, int_dot: bool = False) -> Int8Head:
        """Per-row symmetric int8 of `dense` [V, hidden] (any float dtype); `int_dot`: run it with our
        kernel (all rows at once, activations in int8) instead of torch's (bf16 activations)."""
        return cls.from_rows(lambda start, stop: dense[start:stop], dense.shape[0], dense.shape[1], int_dot)

    @classmethod
    def from_rows(cls, rows: Callable[[int, int], torch.Tensor], vocab: int, hidden: int, int_dot: bool = False) -> Int8Head:
        """As `quantize`, from `rows(start, stop)` -> [stop - start, hidden], taken `CHUNK_ROWS` at a time."""
        q = torch.empty(vocab, hidden, dtype=torch.int8)
        scales = torch.empty(vocab)
        for start in range(0, vocab, CHUNK_ROWS):
            stop = min(vocab, start + CHUNK_ROWS)
            w = rows(start, stop).float()
            s = (w.abs().amax(dim=1) / 127.0).clamp(min=torch.finfo(torch.float32).tiny)
            q[start:stop] = torch.round(w / s[:, None]).clamp(-127, 127).to(torch.int8)
            scales[start:stop] = s
        pack = Int8HeadPack.of(q, scales) if int_dot and packable(vocab, hidden) else None
        # torch's kernel reads `weight`; ours only its pack (the same values), so only one is kept
        return cls(q if pack is None else torch.empty(0, hidden, dtype=torch.int8), scales.to(KERNEL_DTYPE), pack)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Its tensors by name (converted_cache.py keeps them); `of_tensors` rebuilds it."""
        out = {"weight": self.weight, "scales": self.scales}
        if self.pack is not None:
            out.update(packed=self.pack.packed, wsum=self.pack.wsum, wscale=self.pack.wscale)
        return out

    @classmethod
    def of_tensors(cls, t: dict[str, torch.Tensor]) -> Int8Head:
        pack = Int8HeadPack(t["packed"], t["wsum"], t["wscale"]) if "packed" in t else None
        return cls(t["weight"], t["scales"], pack)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes + (self.pack.packed.nbytes if self.pack is not None else 0)

    def int8_weight(self) -> torch.Tensor:
        """[V, hidden] int8, whichever kernel holds it."""
        if self.pack is None:
            return self.weight
        p = self.pack.packed  # [V / 16, hidden / 4, 16, 4]
        return p.permute(0, 2, 1, 3).reshape(p.shape[0] * 16, p.shape[1] * 4)

    def approx_logits(self, x: torch.Tensor) -> torch.Tensor:  # x [S, hidden] -> [S, V] float32
        if self.pack is not None:
            p = self.pack
            return torch.ops.kvstrata.int8_head_logits(x.contiguous(), p.packed, p.wsum, p.wscale)
        return torch.ops.aten._weight_int8pack_mm(x.to(KERNEL_DTYPE), self.weight, self.scales).float()

    def logits(self, x: torch.Tensor, exact: ExactRows, rescore: int = RESCORE_TOP) -> torch.Tensor:
        """[S, V] float32: the int8 logits, each row's `rescore` largest recomputed exactly (rescore_top)."""
        return rescore_top(self.approx_logits(x), x, exact, rescore)


def rescore_top(out: torch.Tensor, x: torch.Tensor, exact: ExactRows, rescore: int) -> torch.Tensor:
    """`out` [S, V] (a quantized head's logits, float32) with each row's `rescore` largest recomputed
    exactly from the head's exact rows (`exact`: the dense head [V, hidden], or a function of row ids) and
    `x` as given (no bf16 rounding): greedy picks the exact head's argmax whenever it is among the quantized
    top `rescore`, and sampling sees exact values where its mass is. In place; returns `out`."""
    top = out.topk(min(rescore, out.shape[1]), dim=-1).indices  # [S, k]; S may be 0 (no logits wanted)
    rows = exact[top] if isinstance(exact, torch.Tensor) else exact(top.flatten()).view(*top.shape, x.shape[1])
    # a matrix-vector product a row, not one bmm: MKL's bmm rounds a row differently by the batch's size
    # (docs/speculative.md), and a verify step's rows must score as their one-row steps do (engine/spec/:
    # greedy output the same with drafts); no slower than the bmm
    rf, xf = rows.float(), x.float()
    scores = torch.stack([torch.mv(rf[i], xf[i]) for i in range(len(xf))]) if len(xf) else out.new_empty(top.shape)
    return out.scatter_(1, top, scores)


def int8_head_supported() -> bool:
    return hasattr(torch.ops.aten, "_weight_int8pack_mm")
