"""Attention over the paged KV pool.

The pool holds, per layer, K and V as [num_slots, Hkv, D] with slot = page * page_size + offset.
The runner flattens one engine step into T new tokens from B sequences; sequence i adds q_len_i
tokens at the end of a context of kv_len_i tokens that lives in the pages of its page table.
Two groups:
  - prefill rows (q_len > 1): attended one sequence at a time (no padding waste on long chunks),
    with torch's scaled_dot_product_attention (a flash kernel on CPU);
  - decode rows (q_len == 1): one padded batch, attended with two grouped matmuls
    (`grouped_decode_attention`: on CPU in bf16 it is ~6x faster than SDPA for one query row);
    when the rows start with the same pages, those are read once (cascade_attention.py).
K/V are gathered a page at a time (one contiguous page_size * Hkv * D block per index), which
copies far faster than gathering token slots.

Backends are chosen by name from ATTENTION_BACKENDS (a fused CUDA paged-attention kernel plugs in
here without touching the model): `torch_sdpa` is the above; `cpu_paged` runs decode rows with our
C++ kernel (cpu_kernels.py), which reads the pages in place; `auto` picks cpu_paged on CPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.nn.functional as F

from kvstrata.model import cpu_kernels
from kvstrata.model.cascade_attention import cascade_decode_attention, merge_partials


@dataclass
class PrefillSeq:
    q_start: int  # first row of this sequence in the flattened step
    q_len: int
    kv_len: int  # context length including the new tokens
    pages: torch.Tensor  # [ceil(kv_len / page_size)] long: the context's page table
    mask: torch.Tensor | None = None  # bottom-right causal mask, built by the first layer, reused by the rest


@dataclass
class AttentionMetadata:
    page_size: int
    slot_mapping: torch.Tensor  # [T] long: where each new token's K/V is written
    prefill: list[PrefillSeq]
    decode_rows: torch.Tensor | None = None  # [B] long: rows of the decode tokens in the step
    decode_pages: torch.Tensor | None = None  # [B, Pmax] long, padded with page 0
    decode_mask: torch.Tensor | None = None  # [B, 1, 1, Pmax * page_size] bool: True = real token
    decode_lens: list[int] | None = None  # [B] context length of each decode row
    decode_lens_t: torch.Tensor | None = None  # the same lengths as a [B] long tensor on the device
    decode_shared_pages: int = 0  # leading pages all decode rows share (cascade_attention.py), 0 = off

    def pure_decode(self, rows: int) -> bool:
        """Whether all `rows` of the step are decode rows (no prefill chunk)."""
        return not self.prefill and self.decode_rows is not None and self.decode_rows.shape[0] == rows


class AttentionBackend(Protocol):
    reads_shared_pages_once: bool  # wants meta.decode_shared_pages (cascade decode), else it stays 0

    def forward(
        self,
        q: torch.Tensor,  # [T, H, D]
        k_cache: torch.Tensor,  # [num_slots, Hkv, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H, D]
        ...


def gather_pages(cache: torch.Tensor, pages: torch.Tensor, page_size: int) -> torch.Tensor:
    """cache [num_slots, Hkv, D], pages [..., P] -> [..., P * page_size, Hkv, D]."""
    paged = cache.view(-1, page_size, *cache.shape[1:])  # [num_pages, ps, Hkv, D]
    out = paged[pages]  # [..., P, ps, Hkv, D]
    return out.flatten(-4, -3)


def _bottom_right_causal(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """[q_len, kv_len] bool: query i (at position kv_len - q_len + i) sees keys j <= its position."""
    rows = torch.arange(q_len, device=device).unsqueeze(1) + (kv_len - q_len)
    cols = torch.arange(kv_len, device=device).unsqueeze(0)
    return cols <= rows


SPLIT_PREFIX_MIN_QUERIES = 256  # below it the masked call costs the same (120 queries over 1.6k: 0.99x)


def _prefix_then_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int) -> torch.Tensor:
    """A chunk's causal attention over `prefix` cached tokens then its own, on CPU: torch's flash
    kernel twice (the prefix unmasked, the chunk's own keys causal), merged by log-sum-exp. The one
    masked call computes every query against every key, the upper triangle too (its mask could be
    anything): 1.5x the work for 2,036 queries over 1,008 cached tokens, 91 vs 140 ms a layer under
    the AVX2 cap. q [1, H, n, D], k/v [1, Hkv, prefix + n, D] -> [1, H, n, D]; within 1e-7 of it."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    o_p, lse_p = flash(q, k[:, :, :prefix], v[:, :, :prefix], 0.0, False)
    o_c, lse_c = flash(q, k[:, :, prefix:], v[:, :, prefix:], 0.0, True)
    return merge_partials(o_p, lse_p.unsqueeze(-1), o_c, lse_c.unsqueeze(-1)).to(q.dtype)


def grouped_decode_attention(
    q: torch.Tensor,  # [B, H, D]
    k: torch.Tensor,  # [B, L, Hkv, D]
    v: torch.Tensor,  # [B, L, Hkv, D]
    mask: torch.Tensor | None,  # [B, 1, 1, L] bool or None (no padding)
) -> torch.Tensor:  # [B, H, D]
    B, H, D = q.shape
    Hkv = k.shape[2]
    qg = q.view(B, Hkv, H // Hkv, D)  # query head h uses kv head h // (H / Hkv)
    # head-major copies: matmul on a transposed *contiguous* operand takes the BLAS path directly
    # (2x faster at 2k tokens than letting matmul copy the permuted view itself)
    kh = k.permute(0, 2, 1, 3).contiguous()  # [B, Hkv, L, D]
    vh = v.permute(0, 2, 1, 3).contiguous()
    scores = torch.matmul(qg, kh.transpose(-1, -2)).float() * (D**-0.5)  # [B, Hkv, G, L]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(-1).to(v.dtype)
    out = torch.matmul(probs, vh)  # [B, Hkv, G, D]
    return out.reshape(B, H, D)


class TorchSDPABackend:
    """Page gather, then SDPA for prefill chunks and grouped matmuls for decode rows."""

    reads_shared_pages_once = True

    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        if meta.pure_decode(q.shape[0]):
            return self._decode(q, k_cache, v_cache, meta)  # pure decode step: no scatter needed
        if len(meta.prefill) == 1 and meta.decode_rows is None and meta.prefill[0].q_len == q.shape[0]:
            return self._prefill(q, k_cache, v_cache, meta.prefill[0], meta.page_size)  # no second [T, H, D]
        out = torch.empty_like(q)
        for seq in meta.prefill:
            rows = slice(seq.q_start, seq.q_start + seq.q_len)
            out[rows] = self._prefill(q[rows], k_cache, v_cache, seq, meta.page_size)
        if meta.decode_rows is not None:
            out[meta.decode_rows] = self._decode(q[meta.decode_rows], k_cache, v_cache, meta)
        return out

    @staticmethod
    def _prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq: PrefillSeq, ps: int) -> torch.Tensor:
        """q [n, H, D]: one sequence's chunk -> [n, H, D], causal over its kv_len tokens."""
        qs = q.transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        ks = gather_pages(k_cache, seq.pages, ps)[: seq.kv_len].transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
        vs = gather_pages(v_cache, seq.pages, ps)[: seq.kv_len].transpose(0, 1).unsqueeze(0)
        if seq.q_len == seq.kv_len:
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        elif q.device.type == "cpu" and seq.q_len >= SPLIT_PREFIX_MIN_QUERIES:
            o = _prefix_then_causal(qs, ks, vs, seq.kv_len - seq.q_len)
        else:
            if seq.mask is None:  # once per forward, not once per layer
                seq.mask = _bottom_right_causal(seq.q_len, seq.kv_len, q.device)
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=seq.mask, enable_gqa=True)
        return o.squeeze(0).transpose(0, 1)

    @staticmethod
    def _decode(
        q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """q: [B, H, D], one token per sequence -> [B, H, D]."""
        assert meta.decode_pages is not None
        assert meta.decode_lens is not None
        c = meta.decode_shared_pages
        if c:  # the shared leading pages once, then each row's own
            assert meta.decode_mask is not None
            ps, shared = meta.page_size, meta.decode_pages[0, :c]
            own = meta.decode_pages[:, c:]
            return cascade_decode_attention(
                q, gather_pages(k_cache, shared, ps), gather_pages(v_cache, shared, ps),
                gather_pages(k_cache, own, ps), gather_pages(v_cache, own, ps), meta.decode_mask[..., c * ps :],
            )
        k = gather_pages(k_cache, meta.decode_pages, meta.page_size)  # [B, Pmax * ps, Hkv, D]
        v = gather_pages(v_cache, meta.decode_pages, meta.page_size)
        # masked, not cut to the exact length even for one row: the runner pads Pmax so the matmul
        # shapes (and oneDNN's per-shape kernels) change every 64 tokens instead of every step
        return grouped_decode_attention(q, k, v, meta.decode_mask)


class CpuPagedBackend(TorchSDPABackend):
    """Decode rows with our C++ kernel (csrc/paged_decode.cpp), which reads each row's K/V pages in
    place: no gather, no head-major copy, one op a layer. Pages that rows share are read by each
    row, from the CPU's caches after the first (no cascade split). Prefill chunks in bf16: on AMX-BF16,
    chunks under SPLIT_PREFIX_MIN_QUERIES queries as that kernel's row groups (an agent's next turn: its
    context read once for all rows, faster than torch's flash kernel there) and longer ones on torch's
    flash kernel, whose oneDNN tiles win once a chunk fills them (docs/cpu-kernels.md has the crossover);
    else with csrc/paged_prefill.cpp where it was built (AVX512-BF16: ~2x torch's flash kernel), else as
    TorchSDPABackend."""

    reads_shared_pages_once = False

    def __init__(self) -> None:
        if not cpu_kernels.load_kernels():
            raise RuntimeError("the cpu_paged attention backend needs its C++ kernel, which did not build here")

    @staticmethod
    def _prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq: PrefillSeq, ps: int) -> torch.Tensor:
        if not cpu_kernels.paged_prefill_supports(q, k_cache):
            return TorchSDPABackend._prefill(q, k_cache, v_cache, seq, ps)
        if cpu_kernels.amx_bf16_attention() and cpu_kernels.paged_decode_supports(q, k_cache):
            n = q.shape[0]
            if n >= SPLIT_PREFIX_MIN_QUERIES:  # a long chunk: torch's flash kernel (split at the prefix) on AMX
                return TorchSDPABackend._prefill(q, k_cache, v_cache, seq, ps)
            # a short chunk (an agent's next turn) as the decode kernel's row group (one token further each,
            # the same pages): on AMX tiles, in place, no packing; each row's bits are its own one-row step's
            lens = torch.arange(seq.kv_len - n + 1, seq.kv_len + 1, dtype=torch.int64)
            pages = seq.pages[None].expand(n, -1).contiguous()  # [n, P]
            return cpu_kernels.paged_decode(q, k_cache, v_cache, pages, lens, ps)
        return cpu_kernels.paged_prefill(q, k_cache, v_cache, seq.pages, seq.kv_len, ps)

    @staticmethod
    def _decode(
        q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        assert meta.decode_pages is not None and meta.decode_lens_t is not None
        if not cpu_kernels.paged_decode_supports(q, k_cache):  # e.g. a head size it is not built for
            return TorchSDPABackend._decode(q, k_cache, v_cache, meta)
        return cpu_kernels.paged_decode(q, k_cache, v_cache, meta.decode_pages, meta.decode_lens_t, meta.page_size)


ATTENTION_BACKENDS: dict[str, Callable[[], AttentionBackend]] = {
    "torch_sdpa": TorchSDPABackend,
    "cpu_paged": CpuPagedBackend,
}


def resolve_attention_backend(name: str, device: torch.device) -> str:
    """`auto`: cpu_paged on CPU where its kernel builds (else torch_sdpa, logged), torch_sdpa on CUDA."""
    if name != "auto":
        return name
    if device.type == "cpu" and cpu_kernels.load_kernels():
        return "cpu_paged"
    return "torch_sdpa"


def attention_layout(backend: AttentionBackend, dtype: torch.dtype, device: torch.device | None = None) -> str:
    """The KV namespace's mark for this backend's numerics: "" for torch's on CUDA, else which
    kernels run (on CPU, chunks of >= SPLIT_PREFIX_MIN_QUERIES over a prefix sum in two parts)."""
    split = "+splitprefix" if device is None or device.type == "cpu" else ""
    if not isinstance(backend, CpuPagedBackend):
        return split
    if dtype == torch.bfloat16 and cpu_kernels.native_bf16_dot():
        if cpu_kernels.amx_bf16_attention():
            return "+cpupaged+bf16prefill+flash"  # short chunks in our kernel, long ones split on torch's flash
        return "+cpupaged+bf16prefill"  # every bf16 prefill chunk in our kernel: no split
    return "+cpupaged" + split


def make_attention_backend(name: str, device: torch.device | None = None) -> AttentionBackend:
    name = resolve_attention_backend(name, device or torch.device("cpu"))
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose from {sorted(ATTENTION_BACKENDS)} or auto")
    if name == "cpu_paged" and device is not None and device.type != "cpu":
        raise ValueError(f"the cpu_paged attention backend runs on CPU only, not {device}")
    return ATTENTION_BACKENDS[name]()
