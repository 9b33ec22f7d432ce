"""Attention over the paged KV pool.

The runner flattens one engine step into T new tokens from B sequences. Each sequence i
contributes q_len_i new tokens at the end of a context of ctx_len_i tokens whose K/V live in the
pool at `slots` (slot = page * page_size + offset). Two groups:
  - prefill rows (q_len > 1): attended one sequence at a time (no padding waste on long chunks);
  - decode rows (q_len == 1): gathered into one padded batch and attended in a single call.

Backends are chosen by name from ATTENTION_BACKENDS (a fused CUDA paged-attention kernel plugs in
here without touching the model).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.nn.functional as F


@dataclass
class PrefillSeq:
    q_start: int  # first row of this sequence in the flattened step
    q_len: int
    slots: torch.Tensor  # [ctx_len] long: K/V slots of the whole context, new tokens last


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] long: where each new token's K/V is written
    prefill: list[PrefillSeq]
    decode_rows: torch.Tensor | None  # [B] long: rows of the decode tokens in the flattened step
    decode_slots: torch.Tensor | None  # [B, Lmax] long (padded with slot 0)
    decode_mask: torch.Tensor | None  # [B, 1, 1, Lmax] bool: True where the slot is real


class AttentionBackend(Protocol):
    def forward(
        self,
        q: torch.Tensor,  # [T, H, D]
        k_cache: torch.Tensor,  # [num_slots, Hkv, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H, D]
        ...


def _bottom_right_causal(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """[q_len, kv_len] bool: query i (at position kv_len - q_len + i) sees keys j <= its position."""
    rows = torch.arange(q_len, device=device).unsqueeze(1) + (kv_len - q_len)
    cols = torch.arange(kv_len, device=device).unsqueeze(0)
    return cols <= rows


class TorchSDPABackend:
    """Gather K/V by slot, then torch's scaled_dot_product_attention (GQA without repeating K/V)."""

    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        if not meta.prefill and meta.decode_rows is not None and meta.decode_rows.shape[0] == q.shape[0]:
            return self._decode(q, k_cache, v_cache, meta)  # pure decode step: no scatter needed
        out = torch.empty_like(q)
        for seq in meta.prefill:
            qs = q[seq.q_start : seq.q_start + seq.q_len].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
            ks = k_cache[seq.slots].transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
            vs = v_cache[seq.slots].transpose(0, 1).unsqueeze(0)
            kv_len = ks.shape[2]
            if seq.q_len == kv_len:
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
            else:
                mask = _bottom_right_causal(seq.q_len, kv_len, q.device)
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)
            out[seq.q_start : seq.q_start + seq.q_len] = o.squeeze(0).transpose(0, 1)
        if meta.decode_rows is not None:
            out[meta.decode_rows] = self._decode(q[meta.decode_rows], k_cache, v_cache, meta)
        return out

    @staticmethod
    def _decode(
        q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """q: [B, H, D] one token per sequence -> [B, H, D]."""
        assert meta.decode_slots is not None
        kd = k_cache[meta.decode_slots].transpose(1, 2)  # [B, Hkv, Lmax, D]
        vd = v_cache[meta.decode_slots].transpose(1, 2)
        mask = meta.decode_mask if q.shape[0] > 1 else None  # one sequence: no padding to mask
        o = F.scaled_dot_product_attention(q.unsqueeze(2), kd, vd, attn_mask=mask, enable_gqa=True)
        return o.squeeze(2)


ATTENTION_BACKENDS: dict[str, Callable[[], AttentionBackend]] = {"torch_sdpa": TorchSDPABackend}


def make_attention_backend(name: str) -> AttentionBackend:
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose from {sorted(ATTENTION_BACKENDS)}")
    return ATTENTION_BACKENDS[name]()
