"""All layers of a pure decode step in one C++ op call (csrc/decode_layers.cpp).

A decode step on the quantized path is ~11 small ops a layer (four linears, RoPE with the K/V write,
paged attention, two fused norms, silu * up), each launched from Python at ~4-5 us of dispatch and
interpreter: ~330 launches, a sixth of a batch-1 step of SmolLM2. `csrc/decode_layers.cpp` runs the
same ops on the same kernels in the same order from C++, so the step's bits do not change (tested
against the Python loop in tests/model/test_decode_layers.py). It applies where every piece of it
does: our integer-dot kernel for every linear, the fused ops, the cpu_paged backend's decode kernel for
these head shapes, no per-head q/k norms (Qwen3), dense MLPs only (an MoE layer, moe.py, keeps no
`LayerLinears`: its step takes the Python loop), and a step whose rows are all decode rows.
`--fused-decode-layers off` keeps the Python loop.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import torch

from kvstrata.model import cpu_kernels
from kvstrata.model.arch import ModelArch
from kvstrata.model.attention import AttentionBackend, AttentionMetadata, CpuPagedBackend
from kvstrata.model.quant.linear import LayerLinears

SLOTS = (("qkv", 3), ("o", 1), ("gate_up", 2), ("down", 1))  # packed parts a linear may have (decode_layers.cpp)


class Layer(Protocol):  # what this reads of layer_weights.LayerWeights
    @property
    def quant(self) -> LayerLinears | None: ...
    @property
    def q_norm(self) -> torch.Tensor | None: ...
    @property
    def qkv_bias(self) -> torch.Tensor | None: ...
    @property
    def post_norm(self) -> torch.Tensor: ...
    @property
    def input_norm(self) -> torch.Tensor: ...


def _flat_weights(layers: Sequence[Layer]) -> list[torch.Tensor] | None:
    """decode_layers.cpp's 10 tensors a layer, or None where a layer is not all on our integer-dot kernel."""
    empty = torch.empty(0)
    out: list[torch.Tensor] = []
    for i, lw in enumerate(layers):
        if lw.quant is None or lw.q_norm is not None:  # quant is None on an MoE layer too
            return None
        for name, slots in SLOTS:
            linear = getattr(lw.quant, name)
            if linear.torch_int4 is not None or len(linear.parts) > slots:
                return None
            out += [*linear.parts, *[empty] * (slots - len(linear.parts))]
        bias = lw.qkv_bias if lw.qkv_bias is not None else empty
        nxt = layers[i + 1].input_norm if i + 1 < len(layers) else empty
        out += [bias, lw.post_norm, nxt]
    return out


class DecodeLayers:
    """The flat weight list and the static checks, made once per model; `run` per step."""

    def __init__(self, weights: list[torch.Tensor], heads: int, kv_heads: int, eps: float, fused_silu: bool,
                 act_bits: int = 16) -> None:
        self.weights, self.act_bits = weights, act_bits
        self.heads, self.kv_heads, self.eps, self.fused_silu = heads, kv_heads, eps, fused_silu

    @classmethod
    def build(cls, layers: Sequence[Layer], arch: ModelArch, dtype: torch.dtype, attention: AttentionBackend,
              int_dot_fused: bool, fused_silu: bool, act_bits: int = 16) -> DecodeLayers | None:
        """None unless the op can run every layer of this model's decode steps; `int_dot_fused`: the model
        runs our fused ops and our integer-dot kernel (LlamaModel.fused_ops and .uses_int_dot)."""
        q = torch.empty(0, arch.num_heads, arch.head_dim, dtype=dtype)  # shapes only, for the kernel's own check
        k = torch.empty(0, arch.num_kv_heads, arch.head_dim, dtype=dtype)
        static_ok = (int_dot_fused and isinstance(attention, CpuPagedBackend) and hasattr(torch.ops.kvstrata, "decode_layers")
                     and cpu_kernels.paged_decode_supports(q, k))
        weights = _flat_weights(layers) if static_ok else None
        if weights is None:
            return None
        return cls(weights, arch.num_heads, arch.num_kv_heads, arch.rms_norm_eps, fused_silu, act_bits)

    @staticmethod
    def applies(meta: AttentionMetadata, rows: int) -> bool:
        """A step of decode rows only (prefill chunks take the Python loop)."""
        return meta.pure_decode(rows) and meta.decode_pages is not None and meta.decode_lens_t is not None

    def run(self, x: torch.Tensor, h: torch.Tensor, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor],
            cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata) -> None:
        """Every layer on x [rows, hidden] (the residual stream, updated in place) from h, the first
        layer's normed input; K/V written to the caches as the Python loop writes them."""
        assert meta.decode_pages is not None and meta.decode_lens_t is not None
        torch.ops.kvstrata.decode_layers(x, h, self.weights, k_cache, v_cache, cos.contiguous(), sin.contiguous(),
                                         meta.slot_mapping, meta.decode_pages, meta.decode_lens_t, meta.page_size,
                                         self.heads, self.kv_heads, self.eps, self.fused_silu, self.act_bits)
