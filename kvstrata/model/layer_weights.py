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
A layer's MLP (`Mlp`) is the dense one (`DenseMlp`: gate/up fused, down) or, in an MoE model, an MoE
block (moe.py) built by the caller: that layer keeps no `LayerLinears` (the one-op decode step runs
dense-MLP layers only), its q/k/v and o linears each take their own quantized form where it has one.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from kvstrata.model import cpu_kernels
from kvstrata.model.quant import int_dot
from kvstrata.model.quant.blocks import IntWeight
from kvstrata.model.quant.linear import LINEAR_PARTS, LayerLinears, QuantLinear, part_names, take_tiles


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

    @property
    def params(self) -> int:
        """Its weights: the multiply-adds a row costs."""
        if self.quant is not None and self.quant.parts:
            return self.quant.out_features * self.quant.in_features
        return self.dense.shape[0] * self.dense.shape[1] if self.dense is not None else 0

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


class Mlp(Protocol):
    """A layer's MLP as the forward pass calls it: `DenseMlp`, or an MoE block (moe.py)."""

    def __call__(self, h: torch.Tensor, narrow: bool, scratch: Scratch, fused_silu: bool) -> torch.Tensor:
        """h [T, hidden] (the normed residual) -> [T, hidden]; `narrow` and `scratch` as `Linear`'s,
        `fused_silu`: silu(gate) * up on our C++ op (LlamaModel.fused_silu)."""
        ...

    def linears(self) -> list[Linear]:
        """Every linear it holds (weights' bytes, kernels, activation bits)."""
        ...

    def token_params(self) -> int:
        """The multiply-adds a token costs in it."""
        ...


@dataclass
class DenseMlp:
    gate_up: Linear  # [2 I, hidden]
    down: Linear  # [hidden, I]

    def __call__(self, h: torch.Tensor, narrow: bool, scratch: Scratch, fused_silu: bool) -> torch.Tensor:
        gate_up = self.gate_up(h, narrow, scratch)  # [T, 2I]
        if fused_silu:
            act = cpu_kernels.silu_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            act = F.silu(gate) * up
        del gate_up
        return self.down(act, narrow, scratch)

    def linears(self) -> list[Linear]:
        return [self.gate_up, self.down]

    def token_params(self) -> int:
        return self.gate_up.params + self.down.params


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: Linear  # [(H + 2 Hkv) * D, hidden], with Qwen2's bias
    q_norm: torch.Tensor | None  # [D] (qwen3)
    k_norm: torch.Tensor | None
    o: Linear  # [hidden, H * D]
    post_norm: torch.Tensor  # [hidden]
    mlp: Mlp  # DenseMlp, or an MoE block (moe.py)
    quant: LayerLinears | None = None  # the four linears' quantized forms (a dense-MLP layer's only)

    @property
    def qkv_bias(self) -> torch.Tensor | None:
        return self.qkv.bias

    def linears(self) -> list[Linear]:
        return [self.qkv, self.o, *self.mlp.linears()]

    def token_params(self) -> int:
        """The multiply-adds a token costs in the layer's linears."""
        return self.qkv.params + self.o.params + self.mlp.token_params()


def build_layer(i: int, tensors: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device,
                tiles: dict[str, torch.Tensor], q4: dict[str, IntWeight], prepack: bool,
                mlp: Mlp | None = None) -> LayerWeights:
    """Layer i from dense `tensors` and quantized `tiles` (int-dot) or `q4` (torch's int4 kernel); `mlp`:
    its MLP where that is not the dense one (an MoE block, moe.py)."""
    quant = None
    if mlp is None:
        quant = LayerLinears.of_tiles(tiles, i) if tiles else LayerLinears.of_torch_int4(q4, i) if q4 else None
    names = LINEAR_PARTS if mlp is None else ("qkv", "o")
    quants = ({name: getattr(quant, name) for name in names} if quant is not None
              else {name: take_tiles(tiles, part_names(i, name)) for name in names} if mlp is not None else {})

    def on_device(name: str) -> torch.Tensor:  # a dense tensor in the model's dtype, on its device
        return tensors[name].to(device=device, dtype=dtype).contiguous()

    def dense(linear: str) -> torch.Tensor | None:
        names = part_names(i, linear)
        if quants.get(linear) is not None and not all(n in tensors for n in names):
            return None  # quantized only
        parts = [on_device(n) if n in tensors else int_dot.dequantize(tiles[n], dtype) for n in names]
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        return prepack_dense(out) if prepack else out

    p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
    bias = None
    if a + "q_proj.bias" in tensors:
        bias = torch.cat([on_device(a + "q_proj.bias"), on_device(a + "k_proj.bias"), on_device(a + "v_proj.bias")])
    linears = {name: Linear(dense(name), quants.get(name)) for name in names}
    linears["qkv"].bias = bias
    return LayerWeights(
        input_norm=on_device(p + "input_layernorm.weight"),
        qkv=linears["qkv"], o=linears["o"],
        q_norm=on_device(a + "q_norm.weight") if a + "q_norm.weight" in tensors else None,
        k_norm=on_device(a + "k_norm.weight") if a + "k_norm.weight" in tensors else None,
        post_norm=on_device(p + "post_attention_layernorm.weight"),
        mlp=mlp if mlp is not None else DenseMlp(linears["gate_up"], linears["down"]),
        quant=quant,
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
