"""A layer's weights as the forward pass reads them, built from whichever forms the loader kept.

Each of the four linears (q/k/v fused into one [(H + 2 Hkv) * D, hidden] matrix, o, gate/up fused into
[2 I, hidden], down) has a dense form, a quantized form (quant/linear.py), or both:
- dense only: a safetensors folder, the exact float32 path, CUDA;
- both: a GGUF whose quantized linears run narrow steps while wide steps use the dense copy (in
  oneDNN's blocked layout where `prepack_dense` put it there);
- quantized only: a GGUF loaded without dense copies (`--prefill-weights dequant`); a wide step then
  dequantizes each linear into a scratch buffer just before its GEMM (`Linear.__call__`).
A layer is quantized whole or not at all (the one-op decode step wants all four on one kernel); a
layer with a linear of another type keeps all four dense (its quantized ones dequantized once).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvstrata.model.quant import int_dot
from kvstrata.model.quant.blocks import IntWeight
from kvstrata.model.quant.linear import LINEAR_PARTS, LayerLinears, QuantLinear, part_names


@dataclass
class Linear:
    dense: torch.Tensor | None  # [N, K] in the model's dtype (maybe prepacked), or None: quantized only
    quant: QuantLinear | None
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor, narrow: bool, scratch: Scratch) -> torch.Tensor:
        """x [T, K] -> [T, N]: the quantized kernel for a narrow step (every step with --prefill-weights
        int), else the dense weight."""
        if narrow and self.quant is not None:
            out = self.quant(x)
            return out if self.bias is None else out + self.bias
        w = self.dense
        if w is None:
            assert self.quant is not None
            return self._dequantized(x, self.quant, scratch)
        if w.is_mkldnn:
            return torch.ops.mkldnn._linear_pointwise(x, w, self.bias, "none", [], "")
        return F.linear(x, w, self.bias)


    def _dequantized(self, x: torch.Tensor, quant: QuantLinear, scratch: Scratch) -> torch.Tensor:
        """x @ W.T with W dequantized SCRATCH_BYTES at a time (a few thousand rows: each GEMM stays large)."""
        n, k = quant.out_features, quant.in_features
        step = max(LANES, SCRATCH_BYTES // (k * x.element_size()) // LANES * LANES)
        buf = scratch.get(min(n, step) * k, x.dtype)
        if step >= n:
            return F.linear(x, quant.dequantize(x.dtype, buf), self.bias)
        out = torch.empty(x.shape[0], n, dtype=x.dtype)
        for start in range(0, n, step):
            stop = min(n, start + step)
            out[:, start:stop] = F.linear(x, quant.dequantize(x.dtype, buf, start, stop))
        return out if self.bias is None else out.add_(self.bias)


SCRATCH_BYTES = 64 << 20  # a wide step's dequantized weight rows at a time
LANES = 16  # rows per int-dot tile: chunks start on a tile


class Scratch:
    """One buffer for the dense weight rows a wide step is multiplying by (reused: no page faults)."""

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None

    def get(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        if self._buf is None or self._buf.numel() < numel or self._buf.dtype != dtype:
            self._buf = torch.empty(numel, dtype=dtype)
        return self._buf


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: Linear  # [(H + 2 Hkv) * D, hidden], with Qwen2's bias
    q_norm: torch.Tensor | None  # [D] (qwen3)
    k_norm: torch.Tensor | None
    o: Linear  # [hidden, H * D]
    post_norm: torch.Tensor  # [hidden]
    gate_up: Linear  # [2 I, hidden]
    down: Linear  # [hidden, I]
    quant: LayerLinears | None = None  # the same four linears' quantized forms

    @property
    def qkv_bias(self) -> torch.Tensor | None:
        return self.qkv.bias

    def linears(self) -> list[Linear]:
        return [self.qkv, self.o, self.gate_up, self.down]


def build_layer(i: int, tensors: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device,
                tiles: dict[str, torch.Tensor], q4: dict[str, IntWeight], prepack: bool) -> LayerWeights:
    """Layer i from dense `tensors` and quantized `tiles` (int-dot) or `q4` (torch's int4 kernel)."""
    quant = LayerLinears.of_tiles(tiles, i) if tiles else LayerLinears.of_torch_int4(q4, i) if q4 else None

    def on_device(name: str) -> torch.Tensor:  # a dense tensor in the model's dtype, on its device
        return tensors[name].to(device=device, dtype=dtype).contiguous()

    def dense(linear: str) -> torch.Tensor | None:
        names = part_names(i, linear)
        if quant is not None and not all(n in tensors for n in names):
            return None  # quantized only
        parts = [on_device(n) if n in tensors else int_dot.dequantize(tiles[n], dtype) for n in names]
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        return prepack_dense(out) if prepack else out

    p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
    bias = None
    if a + "q_proj.bias" in tensors:
        bias = torch.cat([on_device(a + "q_proj.bias"), on_device(a + "k_proj.bias"), on_device(a + "v_proj.bias")])
    linears = {name: Linear(dense(name), getattr(quant, name) if quant else None) for name in LINEAR_PARTS}
    linears["qkv"].bias = bias
    return LayerWeights(
        input_norm=on_device(p + "input_layernorm.weight"),
        q_norm=on_device(a + "q_norm.weight") if a + "q_norm.weight" in tensors else None,
        k_norm=on_device(a + "k_norm.weight") if a + "k_norm.weight" in tensors else None,
        post_norm=on_device(p + "post_attention_layernorm.weight"),
        quant=quant, **linears,
    )


PREPACK_ROWS = 2048  # the row count oneDNN's blocked layout is chosen for (any count runs on it)


def prepack_dense(w: torch.Tensor) -> torch.Tensor:
    """w [N, K] bf16 in oneDNN's blocked layout for Linear: the wide (prefill) steps' GEMMs then skip
    reordering the weight on every call (a few % of their time: docs/cpu-kernels.md), the same bits."""
    return torch.ops.mkldnn._reorder_linear_weight(w, PREPACK_ROWS)


def prepack_supported(device: torch.device, dtype: torch.dtype) -> bool:
    return (device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and _prepack_runs(dtype))


@functools.cache
def _prepack_runs(dtype: torch.dtype) -> bool:
    """oneDNN's bf16 reorder refuses CPUs without avx512bw/vl/dq or avx_ne_convert (an AVX2 CPU given
    --dtype bfloat16, or ONEDNN_MAX_CPU_ISA below them): try it once on a tiny weight."""
    try:
        w = prepack_dense(torch.zeros(16, 32, dtype=dtype))
        torch.ops.mkldnn._linear_pointwise(torch.zeros(2, 32, dtype=dtype), w, None, "none", [], "")
        return True
    except RuntimeError:
        return False
