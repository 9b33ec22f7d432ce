"""The GGUF's own 4-bit weights, for decode steps on CPU (`--q4-decode`).

A decode step of a few rows is bound by reading the weights, not by arithmetic: SmolLM2's linears
are 106 M parameters, 212 MB in bf16 per step. The GGUF stores them as Q4_0/Q4_1 blocks of 32
(18-20 bytes per block), and torch has a CPU kernel for exactly that shape,
`aten._weight_int4pack_mm_for_cpu(x, packed, 32, scale_and_zero)`, which computes
x @ ((q - 8) * scale + zero).T group by group. Both GGUF formats map onto it losslessly:
    Q4_1 (d, m, q in 0..15): w = d * q + m       -> scale = d, zero = m + 8 d
    Q4_0 (d, q in 0..15):    w = d * (q - 8)     -> scale = d, zero = 0
(scale and zero are then held in bf16: a rounding of the block constants instead of the per-weight
rounding of the dense bf16 copy). The kernel always gets bf16 activations: torch vectorizes it for
bf16 only, and with float32 activations it ran ~200x slower (40 ms vs 0.2 ms for one 576x3072
linear at 1 row on an AVX2 EPYC), so a float32 model casts its activations around it. Measured on this 2-core EPYC: the 4
linears of 30 layers take ~4 ms a step at 1 row vs ~11 ms in bf16; at 16+ rows bf16 GEMM wins,
so prefill and wide steps keep the dense weights (ModelRunner picks per step; see LlamaModel).
On x86 CPUs with AVX512-VNNI or AVX2 (and `--fused-ops auto`) our kernel (csrc/int4_linear.cpp) runs them
instead (the same bits on both): activations as 16-bit integers per block of 32 (llama.cpp's 8 cost greedy agreement with
float32), integer dot products with the 4-bit values, every weight read once for all rows of the step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

GROUP = 32  # elements per GGUF Q4 block, and the kernel's group size
KERNEL_DTYPE = torch.bfloat16  # activations the int4 kernel is fast with, whatever the model's dtype


@dataclass
class Q4Weight:
    """One linear's 4-bit weights: w[n, k] = (q[n, k] - 8) * scale[n, k // 32] + zero[n, k // 32]."""

    q: torch.Tensor  # [N, K] uint8, values 0..15
    scale: torch.Tensor  # [N, K / 32] float32
    zero: torch.Tensor  # [N, K / 32] float32

    def dequantize(self) -> torch.Tensor:  # [N, K] float32
        s = self.scale.repeat_interleave(GROUP, dim=1)
        z = self.zero.repeat_interleave(GROUP, dim=1)
        return (self.q.to(torch.float32) - 8) * s + z

    def rows(self, index: torch.Tensor) -> Q4Weight:
        """The rows `index` (a permutation of output rows, e.g. llama.cpp's Q/K order undone)."""
        return Q4Weight(self.q[index], self.scale[index], self.zero[index])


def read_q4(raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> Q4Weight | None:
    """raw [rows, bytes per row] of a GGUF tensor -> Q4Weight, or None if it is not Q4_0/Q4_1."""
    if type_name not in ("Q4_0", "Q4_1") or len(shape) != 2 or shape[1] % GROUP:
        return None
    n, k = shape
    header = 4 if type_name == "Q4_1" else 2  # fp16 d (and fp16 m)
    blocks = np.ascontiguousarray(raw).reshape(n, k // GROUP, header + GROUP // 2)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [N, K / 32]
    packed = blocks[..., header:]  # [N, K / 32, 16]: element j in the low nibble, j + 16 in the high
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(n, k)
    if type_name == "Q4_1":
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        zero = m + 8 * d
    else:
        zero = np.zeros_like(d)
    return Q4Weight(torch.from_numpy(q.astype(np.uint8)), torch.from_numpy(d), torch.from_numpy(zero))


@dataclass
class VnniInt4:
    """A Q4Weight in csrc/int4_linear.cpp's layout (see there): w = scale * q + bias per block, and
    per (16 output rows, 32 inputs) 256 bytes of 4-bit pairs, 16 float16 scales, 16 float16 biases."""

    packed: torch.Tensor  # [N / 16, K / 32, 320] uint8

    @classmethod
    def of(cls, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> VnniInt4:
        N, K = q.shape
        # [row block, row i, k-block j, half (k < 16 or not), vector v, byte b] -> [block, j, v, i, b]
        q6 = q.to(torch.uint8).view(N // 16, 16, K // GROUP, 2, 4, 4)
        pairs = (q6[:, :, :, 0] | (q6[:, :, :, 1] << 4)).permute(0, 2, 3, 1, 4).reshape(N // 16, K // GROUP, 256)

        def blocked(t: torch.Tensor) -> torch.Tensor:  # [N, K / 32] -> [N / 16, K / 32, 32] bytes of float16
            return t.half().view(N // 16, 16, K // GROUP).permute(0, 2, 1).contiguous().view(torch.uint8)

        return cls(torch.cat([pairs, blocked(scale), blocked(zero - 8 * scale)], dim=-1).contiguous())


def vnni_int4_packable(n: int, k: int) -> bool:
    return n % 16 == 0 and k % GROUP == 0


@dataclass
class PackedInt4:
    """A Q4Weight in the layout of torch's CPU int4 kernel (and of ours, `vnni`, where asked)."""

    packed: torch.Tensor  # from aten._convert_weight_to_int4pack_for_cpu
    scale_zero: torch.Tensor  # [K / 32, N, 2] in KERNEL_DTYPE
    out_features: int
    vnni: VnniInt4 | None = None  # set: linear() runs csrc/int4_linear.cpp (avx512_vnni or avx2 CPUs)

    @classmethod
    def from_q4(cls, parts: list[Q4Weight], dtype: torch.dtype, vnni: bool = False) -> PackedInt4:
        """Pack the row-concatenation of `parts` (fused qkv, gate_up) for a model of `dtype`
        (bfloat16 or float32; torch's kernel itself runs in KERNEL_DTYPE)."""
        q = torch.cat([p.q for p in parts]).to(torch.int32)  # [N, K]
        scale = torch.cat([p.scale for p in parts])  # [N, K / 32]
        zero = torch.cat([p.zero for p in parts])
        if vnni and vnni_int4_packable(*q.shape):  # ours only: torch's packing is not kept
            return cls(torch.empty(0), torch.empty(0), q.shape[0], VnniInt4.of(q, scale, zero))
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        scale_zero = torch.stack([scale.t(), zero.t()], dim=-1).to(KERNEL_DTYPE).contiguous()  # [K / 32, N, 2]
        return cls(packed, scale_zero, q.shape[0])

    def linear(self, x: torch.Tensor) -> torch.Tensor:  # x [T, K] -> [T, N] in x's dtype
        if self.vnni is not None:
            return torch.ops.kvstrata.int4_linear(x.contiguous(), self.vnni.packed)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(KERNEL_DTYPE), self.packed, GROUP, self.scale_zero)
        return out.to(x.dtype)


def q4_decode_supported(device: torch.device, dtype: torch.dtype) -> str | None:
    """None if the int4 decode path can run here, else why not."""
    if device.type != "cpu":
        return f"device {device} (the int4 kernel used is CPU-only)"
    if dtype not in (torch.bfloat16, torch.float32):
        return f"dtype {dtype} (the CPU int4 kernel takes bfloat16 or float32 activations)"
    if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        return f"torch {torch.__version__} has no aten._weight_int4pack_mm_for_cpu"
    return None


def q4_decode_wanted(mode: str, device: torch.device, dtype: torch.dtype, auto_on: bool | None = None) -> bool:
    """`--q4-decode`: auto = `auto_on` where the kernel runs (dtype_plan.py's choice; by default CPU
    bfloat16 only, so an explicit float32 stays transformers-identical); on = wherever the kernel
    runs (ValueError where it cannot); off = never."""
    why_not = q4_decode_supported(device, dtype)
    if mode == "on" and why_not:
        raise ValueError(f"--q4-decode on is not possible here: {why_not}; use --q4-decode off")
    if auto_on is None:
        auto_on = dtype == torch.bfloat16
    return mode == "on" or (mode == "auto" and why_not is None and auto_on)
