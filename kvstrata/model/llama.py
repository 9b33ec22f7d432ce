"""Llama-family forward (Llama, SmolLM2, Qwen2 biases, Qwen3 q/k norms) over the paged KV pool.

Weights come in Hugging Face names (see model/weights.py) and are fused at load time:
q/k/v into one [ (H + 2 Hkv) * D, hidden ] matrix and gate/up into one [2 I, hidden] matrix, so a
layer runs 4 GEMMs instead of 7. Numerics follow transformers' LlamaModel: RMSNorm in float32 then
cast back, RoPE tables computed in float32 (rotate_half layout), logits in float32.
Given the GGUF's 4-bit linears (`q4`), steps of at most `q4_max_rows` rows (decode) run on them
instead (q4_weights.py: weight reads, not arithmetic, bound those steps), with an int8 LM head
(int8_head.py); wider steps use the dense copies.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvstrata.model import cpu_kernels
from kvstrata.model.arch import ModelArch
from kvstrata.model.attention import AttentionBackend, AttentionMetadata
from kvstrata.model.decode_layers import DecodeLayers
from kvstrata.model.int8_head import Int8Head, int8_head_supported
from kvstrata.model.q4_weights import PackedInt4, Q4Weight
from kvstrata.model.rope import rope_tables


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: torch.Tensor  # [(H + 2 Hkv) * D, hidden]
    qkv_bias: torch.Tensor | None  # [(H + 2 Hkv) * D]
    q_norm: torch.Tensor | None  # [D] (qwen3)
    k_norm: torch.Tensor | None
    o: torch.Tensor  # [hidden, H * D]
    post_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor  # [2 I, hidden]
    down: torch.Tensor  # [hidden, I]
    int4: LayerInt4 | None = None  # the same four linears as 4-bit blocks, for narrow steps


@dataclass
class LayerInt4:
    qkv: PackedInt4
    o: PackedInt4
    gate_up: PackedInt4
    down: PackedInt4

    @classmethod
    def from_q4(cls, q4: dict[str, Q4Weight], layer: int, dtype: torch.dtype, vnni: bool = False) -> LayerInt4 | None:
        """None unless every linear of the layer is in `q4`; `vnni`: for csrc/int4_linear.cpp."""
        a, m = f"model.layers.{layer}.self_attn.", f"model.layers.{layer}.mlp."
        names = [[a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"], [a + "o_proj.weight"],
                 [m + "gate_proj.weight", m + "up_proj.weight"], [m + "down_proj.weight"]]
        if not all(n in q4 for group in names for n in group):
            return None
        qkv, o, gate_up, down = (PackedInt4.from_q4([q4[n] for n in group], dtype, vnni) for group in names)
        return cls(qkv, o, gate_up, down)


def linear(x: torch.Tensor, dense: torch.Tensor, int4: PackedInt4 | None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W.T (+ bias) with the 4-bit copy of W when given, else the dense one (held in oneDNN's
    blocked layout where `prepack_dense` put it there)."""
    if int4 is None:
        if dense.is_mkldnn:
            return torch.ops.mkldnn._linear_pointwise(x, dense, bias, "none", [], "")
        return F.linear(x, dense, bias)
    out = int4.linear(x)
    return out if bias is None else out + bias


PREPACK_ROWS = 2048  # the row count oneDNN's blocked layout is chosen for (any count runs on it)


def prepack_dense(w: torch.Tensor) -> torch.Tensor:
    """w [N, K] bf16 in oneDNN's blocked layout for linear(): the wide (prefill) steps' GEMMs then skip
    reordering the weight on every call: 3-5% of their time on the Zen 4 EPYC, the same bits."""
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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaModel:
    def __init__(
        self,
        arch: ModelArch,
        tensors: dict[str, torch.Tensor],
        dtype: torch.dtype,
        device: torch.device,
        attention: AttentionBackend,
        q4: dict[str, Q4Weight] | None = None,
        q4_max_rows: int = 8,
        fused_ops: bool = True,
        fused_decode_layers: bool = True,
    ) -> None:
        self.arch = arch
        self.q4_max_rows = q4_max_rows
        self.dtype = dtype
        self.device = device
        self.attention = attention

        def w(name: str) -> torch.Tensor:
            return tensors[name].to(device=device, dtype=dtype).contiguous()

        def opt(name: str) -> torch.Tensor | None:
            return w(name) if name in tensors else None

        self.embed = w("model.embed_tokens.weight")  # [V, hidden]
        self.lm_head = self.embed if "lm_head.weight" not in tensors else w("lm_head.weight")
        self.norm = w("model.norm.weight")
        cpu_ops = fused_ops and device.type == "cpu" and cpu_kernels.load_kernels()  # our C++ ops can run
        # where the CPU has AVX512-VNNI or AVX2, the 4-bit linears and the int8 head run on our kernels
        # (csrc/int4_linear.cpp, int8_head.cpp; the same bits on both): part of the fused ops, never on
        # the exact path (no q4)
        vnni = bool(q4) and cpu_ops and cpu_kernels.int_dot_simd()
        self.layers: list[LayerWeights] = []
        for i in range(arch.num_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            bias = None
            if a + "q_proj.bias" in tensors:
                bias = torch.cat([w(a + "q_proj.bias"), w(a + "k_proj.bias"), w(a + "v_proj.bias")])
            self.layers.append(
                LayerWeights(
                    input_norm=w(p + "input_layernorm.weight"),
                    qkv=torch.cat([w(a + "q_proj.weight"), w(a + "k_proj.weight"), w(a + "v_proj.weight")]),
                    qkv_bias=bias,
                    q_norm=opt(a + "q_norm.weight"),
                    k_norm=opt(a + "k_norm.weight"),
                    o=w(a + "o_proj.weight"),
                    post_norm=w(p + "post_attention_layernorm.weight"),
                    gate_up=torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")]),
                    down=w(p + "mlp.down_proj.weight"),
                    int4=LayerInt4.from_q4(q4, i, dtype, vnni) if q4 else None,
                )
            )
        self.uses_int4 = any(layer.int4 is not None for layer in self.layers)
        self.uses_vnni = vnni and self.uses_int4
        # float32 on the dense weights is bound to match transformers token for token: torch's own ops
        # there; elsewhere on CPU each norm (and the residual add before it), RoPE with the K/V
        # write, and the MLP's silu(gate) * up are one C++ op each (cpu_kernels.py)
        self.exact = dtype == torch.float32 and not self.uses_int4
        self.fused_ops = cpu_ops and not self.exact
        self.fused_silu = self.fused_ops and cpu_kernels.has_avx512()  # its portable loop is not faster than torch's
        self.prepacked = self.fused_ops and prepack_supported(device, dtype)
        if self.prepacked:
            for lw in self.layers:
                lw.qkv, lw.o, lw.gate_up, lw.down = (prepack_dense(t) for t in (lw.qkv, lw.o, lw.gate_up, lw.down))
        # narrow steps read the LM head in int8 too (int8_head.py); off with the 4-bit linears (--q4-decode off)
        self.lm_head_int8 = Int8Head.quantize(self.lm_head, self.uses_vnni) if self.uses_int4 and int8_head_supported() else None
        # a pure decode step's layers in one C++ call where every op of it is ours (decode_layers.py)
        self.decode_layers = (DecodeLayers.build(self.layers, arch, dtype, attention, self.fused_ops and self.uses_vnni,
                                                 self.fused_silu) if fused_decode_layers else None)
        cos, sin = rope_tables(arch, device)
        self.cos = cos.to(dtype)  # [max_position, D]
        self.sin = sin.to(dtype)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.fused_ops:
            return cpu_kernels.rms_norm(x, weight, self.arch.rms_norm_eps)
        return rms_norm(x, weight, self.arch.rms_norm_eps)

    def _add_norm(self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x += delta (in place), then the norm of x."""
        if self.fused_ops:
            return cpu_kernels.add_rms_norm(x, delta, weight, self.arch.rms_norm_eps)
        x.add_(delta)
        return rms_norm(x, weight, self.arch.rms_norm_eps)

    def _rope_store(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lw: LayerWeights,
                    k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """torch ops: (Qwen3's q/k norms,) RoPE on q and k, k and v into the cache rows `slots`; q [T, H, D]."""
        arch = self.arch
        T, H, Hkv, D = qkv.shape[0], arch.num_heads, arch.num_kv_heads, arch.head_dim
        qk = qkv[:, : (H + Hkv) * D].view(T, H + Hkv, D)  # q and k heads: one RoPE for both
        v = qkv[:, (H + Hkv) * D :].view(T, Hkv, D)
        if lw.q_norm is not None and lw.k_norm is not None:
            qk = torch.cat([rms_norm(qk[:, :H], lw.q_norm, arch.rms_norm_eps),
                            rms_norm(qk[:, H:], lw.k_norm, arch.rms_norm_eps)], dim=1)
        qk = qk * cos + rotate_half(qk) * sin
        k_cache.index_copy_(0, slots, qk[:, H:])
        v_cache.index_copy_(0, slots, v)
        return qk[:, :H]

    def _mlp(self, x: torch.Tensor, h: torch.Tensor, li: int, q4: LayerInt4 | None) -> torch.Tensor:
        """Layer li's MLP on h, added to x in place; returns the next layer's normed input (else h)."""
        lw = self.layers[li]
        gate_up = linear(h, lw.gate_up, q4 and q4.gate_up)  # [T, 2I]
        if self.fused_silu:
            act = cpu_kernels.silu_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            act = F.silu(gate) * up
        mlp = linear(act, lw.down, q4 and q4.down)
        if li + 1 < len(self.layers):
            return self._add_norm(x, mlp, self.layers[li + 1].input_norm)
        x.add_(mlp)
        return h

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [T] long
        positions: torch.Tensor,  # [T] long
        meta: AttentionMetadata,
        k_cache: list[torch.Tensor],  # per layer [num_slots, Hkv, D]
        v_cache: list[torch.Tensor],
        logit_rows: torch.Tensor,  # [S] long: rows whose next-token logits are wanted
    ) -> torch.Tensor:  # [S, V] float32
        T = input_ids.shape[0]
        cos_t, sin_t = self.cos[positions], self.sin[positions]  # [T, D]
        x = F.embedding(input_ids, self.embed)  # [T, hidden]: the residual stream, added to in place
        narrow = T <= self.q4_max_rows
        h = self._norm(x, self.layers[0].input_norm)
        if narrow and self.decode_layers is not None and self.decode_layers.applies(meta, T):
            self.decode_layers.run(x, h, k_cache, v_cache, cos_t, sin_t, meta)
        else:
            self._layers(x, h, cos_t, sin_t, meta, k_cache, v_cache, narrow)
        last = self._norm(x[logit_rows], self.norm)
        if narrow and self.lm_head_int8 is not None:
            return self.lm_head_int8.logits(last, self.lm_head)
        return F.linear(last, self.lm_head).float()

    def _layers(self, x: torch.Tensor, h: torch.Tensor, cos_t: torch.Tensor, sin_t: torch.Tensor,
                meta: AttentionMetadata, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor], narrow: bool) -> None:
        """Every layer on x (the residual stream, updated in place) from h, the first layer's normed input."""
        arch = self.arch
        H, Hkv, D = arch.num_heads, arch.num_kv_heads, arch.head_dim
        T = x.shape[0]
        cos, sin = cos_t.unsqueeze(1), sin_t.unsqueeze(1)  # [T, 1, D]
        for li, lw in enumerate(self.layers):
            q4 = lw.int4 if narrow else None
            qkv = linear(h, lw.qkv, q4 and q4.qkv, lw.qkv_bias)  # [T, (H + 2 Hkv) * D]
            if self.fused_ops and lw.q_norm is None:  # RoPE + the K/V write in one op
                q = cpu_kernels.rope_store(qkv, cos_t, sin_t, k_cache[li], v_cache[li], meta.slot_mapping, H, Hkv)
            else:
                q = self._rope_store(qkv, cos, sin, lw, k_cache[li], v_cache[li], meta.slot_mapping)
            o = self.attention.forward(q, k_cache[li], v_cache[li], meta)  # [T, H, D]
            h = self._add_norm(x, linear(o.reshape(T, H * D), lw.o, q4 and q4.o), lw.post_norm)
            h = self._mlp(x, h, li, q4)
