"""Llama-family forward (Llama, SmolLM2, Qwen2 biases, Qwen3 q/k norms, Qwen3-MoE) over the paged KV pool.

Weights come in Hugging Face names (see model/weights.py) and are fused at load time:
q/k/v into one [ (H + 2 Hkv) * D, hidden ] matrix and gate/up into one [2 I, hidden] matrix, so a
layer runs 4 GEMMs instead of 7 (layer_weights.py). Numerics follow transformers' LlamaModel: RMSNorm
in float32 then cast back, RoPE tables computed in float32 (rotate_half layout), logits in float32.
Given a GGUF's quantized linears (`tiles` for our integer-dot kernels, or `q4` for torch's int4 one),
steps of at most `q4_max_rows` rows (decode; `decode_max_rows` for pure decode steps, and fewer rows for steps
with prompt rows when the weights have many bits: `prefill_narrow_rows`) run on them instead (quant/: weight
reads, not arithmetic, bound those steps), with an int8 LM head (embed_head.py); wider steps use the dense weights, or
dequantize each linear just before its GEMM where the model keeps no dense copy, or (`int_prefill`)
run on the integer-dot kernels too. A layer's MLP is the dense one or an MoE block (moe.py), chosen per
layer at load; the forward calls whichever it is.
"""
from __future__ import annotations

import torch

from kvstrata.model import cpu_kernels
from kvstrata.model.arch import ModelArch
from kvstrata.model.attention import AttentionBackend, AttentionMetadata
from kvstrata.model.decode_layers import DecodeLayers
from kvstrata.model.embed_head import EMBED, HEAD, Embedding, Head
from kvstrata.model.layer_weights import LayerWeights, Scratch, build_layer, prepack_supported
from kvstrata.model.moe import WeightForms, build_moe
from kvstrata.model.quant.blocks import IntWeight
from kvstrata.model.quant.gguf_rows import GgufRows
from kvstrata.model.rope import rope_tables
from kvstrata.model.row_chunks import chunk_rows, chunks, prompt_chunks

# rows x bits a quantized weight: where dense copies exist, a step with prompt rows runs on the quantized
# kernels up to this over the weights' bits (5 bits: 8 rows, 8.5: 5), the crossing docs/cpu-kernels.md
# measures (a next turn's few new tokens)
PREFILL_BIT_ROWS = 48


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
        tiles: dict[str, torch.Tensor] | None = None,
        q4: dict[str, IntWeight] | None = None,
        rows: dict[str, GgufRows] | None = None,
        q4_max_rows: int = 8,
        decode_max_rows: int | None = None,
        fused_ops: bool = True,
        fused_decode_layers: bool = True,
        act_bits: int = 16,
        int_prefill: bool = False,
        head_bits: int = 8,
    ) -> None:
        """`tiles`: linears as int-dot tiles (run by our kernels, which must be built: cpu_kernels);
        `q4`: Q4 linears for torch's int4 kernel; `rows`: embedding / LM head read from the file
        where `tensors` has no dense copy (gguf_loader.py); `act_bits`: the integer activations of the
        int-dot linears (8 or 16, `--activation-bits`); `int_prefill`: wide steps' linears on them too
        (`--prefill-weights int`); `head_bits`: the quantized LM head's bits (8, or 4 on the integer-dot
        kernels: `--head-bits`, embed_head.py)."""
        self.arch = arch
        self.q4_max_rows = q4_max_rows
        # a step of decode rows only (a batch, or a verify step's rows: engine/spec/) stays on the quantized
        # kernels up to this many rows: no prompt chunk's numerics change, only the batch where dense wins
        self.decode_max_rows = max(q4_max_rows, decode_max_rows or q4_max_rows)
        self.dtype = dtype
        self.device = device
        self.attention = attention
        tiles, q4, rows = tiles or {}, q4 or {}, rows or {}
        cpu_ops = fused_ops and device.type == "cpu" and cpu_kernels.load_kernels()  # our C++ ops can run
        for source in rows.values():  # read and dequantized by our op (the same values as the gguf package's)
            source.native = cpu_ops
        # where the CPU has AVX512-VNNI or AVX2, quantized linears and the quantized head run on our integer-dot
        # kernels: part of the fused ops, never on the exact path
        assert not tiles or (device.type == "cpu" and cpu_kernels.load_kernels()), "int-dot tiles need our CPU kernels"
        self.uses_int_dot = bool(tiles)
        prepack = cpu_ops and prepack_supported(device, dtype)
        forms = WeightForms(tensors, tiles, dtype, device)
        self.layers: list[LayerWeights] = [  # each layer's MLP the dense one, or its MoE block (moe.py)
            build_layer(i, tensors, dtype, device, tiles, q4, prepack,
                        build_moe(arch, i, forms) if arch.moe_layer(i) else None)
            for i in range(arch.num_layers)]
        self.uses_quant = any(lin.quant is not None for layer in self.layers for lin in layer.linears())
        self.int_prefill = int_prefill and self.uses_int_dot
        self.decode_layers: DecodeLayers | None = None  # built below, once the head and fused ops are known
        self.set_act_bits(act_bits if self.uses_int_dot else 16)
        self.dense_linears = all(lin.dense is not None for layer in self.layers for lin in layer.linears())
        self.prefill_narrow_rows = self._prefill_narrow_rows()
        self.prepacked = prepack and self.dense_linears
        self._scratch = Scratch()
        # float32 on the dense weights is bound to match transformers token for token: torch's own ops
        # there; elsewhere on CPU each norm (and the residual add before it), RoPE with the K/V
        # write, and the MLP's silu(gate) * up are one C++ op each (cpu_kernels.py)
        self.exact = dtype == torch.float32 and not self.uses_quant
        self.fused_ops = cpu_ops and not self.exact
        self.fused_silu = self.fused_ops and cpu_kernels.silu_mul_simd()  # its portable loop is not faster than torch's

        def dense(name: str) -> torch.Tensor | None:
            return tensors[name].to(device=device, dtype=dtype).contiguous() if name in tensors else None

        self.norm = dense("model.norm.weight")
        embed = dense(EMBED)
        self.embedding = Embedding(embed, rows.get(EMBED), dtype)
        head_rows = rows.get(EMBED if arch.tie_word_embeddings else HEAD)
        self.head = Head(embed if arch.tie_word_embeddings else dense(HEAD), head_rows, self.uses_quant,
                         self.uses_int_dot and cpu_kernels.int_dot_simd(), dtype, head_bits)
        # a pure decode step's layers in one C++ call where every op of it is ours (decode_layers.py)
        self.decode_layers = (DecodeLayers.build(self.layers, arch, dtype, attention, self.fused_ops and self.uses_int_dot,
                                                 self.fused_silu, self.act_bits) if fused_decode_layers else None)
        cos, sin = rope_tables(arch, device)
        self.cos = cos.to(dtype)  # [max_position, D]
        self.sin = sin.to(dtype)

    def set_act_bits(self, bits: int) -> None:
        """The integer activations (8 or 16) of every int-dot linear and of the decode-layers op."""
        self.act_bits = bits
        for layer in self.layers:
            for lin in layer.linears():
                if lin.quant is not None:
                    lin.quant.act_bits = bits
        if self.decode_layers is not None:
            self.decode_layers.act_bits = bits

    def linear_params(self) -> int:
        """Weights of the layers' linears: the multiply-adds a token costs in them."""
        return sum(layer.token_params() for layer in self.layers)

    def resident_bytes(self) -> dict[str, int]:
        """Bytes the weights hold, by form (for the start-up plan line)."""
        out = {"dense": 0, "quantized": 0, "lm_head": 0}
        for layer in self.layers:
            for lin in layer.linears():
                out["dense"] += lin.dense.numel() * lin.dense.element_size() if lin.dense is not None else 0
                out["quantized"] += lin.quant.nbytes() if lin.quant is not None else 0
        for t in {id(t): t for t in (self.embedding.dense, self.head.dense) if t is not None}.values():
            out["dense"] += t.nbytes
        if self.head.quant is not None:
            out["lm_head"] = self.head.quant.nbytes
        return out

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

    def _mlp(self, x: torch.Tensor, h: torch.Tensor, li: int, narrow: bool, rows: int) -> torch.Tensor:
        """Layer li's MLP on h, added to x in place; returns the next layer's normed input (else h),
        written over h chunk by chunk where the step runs in chunks of `rows` (`_layers`)."""
        lw = self.layers[li]
        norm = self.layers[li + 1].input_norm if li + 1 < len(self.layers) else None
        T = h.shape[0]
        if rows >= T:
            mlp = lw.mlp(h, narrow, self._scratch, self.fused_silu)
            if norm is not None:
                return self._add_norm(x, mlp, norm)
            x.add_(mlp)
            return h
        for r in chunks(T, rows):  # chunk r's rows of h are read once, then take the next layer's input
            mlp = lw.mlp(h[r], narrow, self._scratch, self.fused_silu)
            if norm is not None:
                h[r] = self._add_norm(x[r], mlp, norm)
            else:
                x[r].add_(mlp)
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
        wide_rescore: bool = False,  # some row is sampled or constrained: the 4-bit head rescores more (embed_head.py)
    ) -> torch.Tensor:  # [S, V] float32
        T = input_ids.shape[0]
        cos_t, sin_t = self.cos[positions], self.sin[positions]  # [T, D]
        x = self.embedding(input_ids)  # [T, hidden]: the residual stream, added to in place
        # a step of up to decode_max_rows rows runs on the quantized kernels if it is decode rows, or where
        # the model keeps no dense copy (a prefill step would dequantize every linear for a few tokens, as an
        # agent's next turn does)
        narrow = T <= self.decode_max_rows and (meta.pure_decode(T) or not self.dense_linears or T <= self.prefill_narrow_rows)
        if narrow and self.decode_layers is not None and self.decode_layers.applies(meta, T):
            self.decode_layers.run(x, self._norm(x, self.layers[0].input_norm), k_cache, v_cache, cos_t, sin_t, meta)
        else:
            self._layers(x, cos_t, sin_t, meta, k_cache, v_cache, narrow or self.int_prefill)
        return self.head(self._norm(x[logit_rows], self.norm), narrow, wide_rescore)

    def _prefill_narrow_rows(self) -> int:
        """The widest step with prompt rows that runs on the quantized kernels where dense copies exist
        (decode steps: up to decode_max_rows). The quantized kernel's arithmetic grows with the rows while
        the dense GEMM reads the bf16 weights whatever the rows, so the crossing falls as the quantized
        weights' bits rise: PREFILL_BIT_ROWS / bits a weight, at most q4_max_rows. (On AMX tiles the
        quantized step stays faster to ~20 rows, but a prompt step on them has other numerics than the
        dense one a cache-off prefill takes: docs/cpu-kernels.md says why the crossing stays here.)"""
        quant = [lin for layer in self.layers for lin in layer.linears() if lin.quant is not None]
        nbytes, params = sum(lin.quant.nbytes() for lin in quant), sum(lin.params for lin in quant)  # type: ignore[union-attr]
        if not self.dense_linears or not nbytes or not params:
            return self.q4_max_rows
        bits = 8 * nbytes / params
        return max(1, min(self.q4_max_rows, int(PREFILL_BIT_ROWS / bits)))

    def _layers(self, x: torch.Tensor, cos_t: torch.Tensor, sin_t: torch.Tensor, meta: AttentionMetadata,
                k_cache: list[torch.Tensor], v_cache: list[torch.Tensor], narrow: bool) -> None:
        """Every layer on x (the residual stream, updated in place).
        On the integer-dot kernels (narrow) a step wider than `chunk_rows` runs each row-wise part
        (q/k/v with RoPE and the K/V write, the o projection with its norm, the MLP) in chunks of that
        many rows, attention on all rows at once: a row's result is the same bits (rows are independent
        there), and the step holds a few MiB of those activations at a time instead of ~300 MiB a layer
        for a 2k-token step of a 2048-wide model, which glibc's heap would keep (peak RSS). A step that is
        one prompt alone runs attention in those chunks too (`prompt_chunks`: a chunk's q over the context
        up to its last row), so no step-sized q or attention output is held either."""
        H, D = self.arch.num_heads, self.arch.head_dim
        T = x.shape[0]
        rows = chunk_rows(self.arch.intermediate_size, x.element_size()) if narrow else T
        h = self._norm(x, self.layers[0].input_norm)
        # (rows, their attention metadata) run one after another: the whole step, or a lone prompt's chunks
        parts = [(slice(0, T), meta)] if rows >= T else prompt_chunks(meta, T, rows)
        q_rows = None
        if parts is None:  # every layer's q, for attention over all rows at once
            q_rows = torch.empty((T, H, D), dtype=x.dtype, device=x.device)
        for li, lw in enumerate(self.layers):
            if parts is not None:
                for r, sub in parts:  # h's rows are spent by their q/k/v: they take the MLP's input
                    q = self._qkv_rope(h[r], lw, li, cos_t[r], sin_t[r], k_cache, v_cache, sub.slot_mapping, narrow)
                    o = self.attention.forward(q, k_cache[li], v_cache[li], sub).reshape(r.stop - r.start, H * D)
                    del q
                    normed = self._add_norm(x[r], lw.o(o, narrow, self._scratch), lw.post_norm)
                    del o
                    if r.stop - r.start == T:
                        h = normed  # the whole step: no copy
                    else:
                        h[r] = normed
            else:
                for r in chunks(T, rows):
                    q_rows[r] = self._qkv_rope(h[r], lw, li, cos_t[r], sin_t[r], k_cache, v_cache,
                                               meta.slot_mapping[r], narrow)
                o = self.attention.forward(q_rows, k_cache[li], v_cache[li], meta).reshape(T, H * D)
                for r in chunks(T, rows):  # h's rows are spent (q/k/v above): they take the MLP's input
                    h[r] = self._add_norm(x[r], lw.o(o[r], narrow, self._scratch), lw.post_norm)
                del o
            h = self._mlp(x, h, li, narrow, rows)

    def _qkv_rope(self, h: torch.Tensor, lw: LayerWeights, li: int, cos_t: torch.Tensor, sin_t: torch.Tensor,
                  k_cache: list[torch.Tensor], v_cache: list[torch.Tensor], slots: torch.Tensor,
                  narrow: bool) -> torch.Tensor:
        """Rows h [T, hidden] -> q [T, H, D] with RoPE; their k (rotated) and v written to the cache rows `slots`."""
        H, Hkv = self.arch.num_heads, self.arch.num_kv_heads
        qkv = lw.qkv(h, narrow, self._scratch)  # [T, (H + 2 Hkv) * D]
        if self.fused_ops:  # (Qwen3's q/k norms,) RoPE and the K/V write in one op
            return cpu_kernels.rope_store(qkv, cos_t, sin_t, k_cache[li], v_cache[li], slots, H, Hkv, lw.q_norm,
                                          lw.k_norm, self.arch.rms_norm_eps)
        return self._rope_store(qkv, cos_t.unsqueeze(1), sin_t.unsqueeze(1), lw, k_cache[li], v_cache[li], slots)
