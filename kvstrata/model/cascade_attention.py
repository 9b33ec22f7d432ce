"""Cascade decode attention: the pages every decode row shares are read once per step.

Agent sessions share their system prompt and tools, so the decode rows of one step usually
start with the same physical pages (the prefix cache hands every session the same ones). The
plain decode path gathers each row's whole context, copying the shared pages once per row; at
4 rows of 2k tokens that copy is most of a decode step. Here the shared leading pages are
gathered once and all B * H query rows attend to them in one matmul per KV head; each row then
attends to its own remaining pages, and the two partial results are merged by their
log-sum-exp (softmax over a union of disjoint key sets):
    out = (exp(lse_s) * out_s + exp(lse_u) * out_u) / (exp(lse_s) + exp(lse_u))
Keys are order-free here: RoPE was applied to K when it was written.
"""
from __future__ import annotations

import torch

# below this many shared pages the extra matmuls cost more than the saved copies
MIN_SHARED_PAGES = 4


def shared_leading_pages(tables: list[list[int]], lens: list[int], page_size: int) -> int:
    """How many leading pages all page tables have in common, leaving every row at least one key
    of its own (so neither part of the softmax is empty); 0 for a single row."""
    if len(tables) < 2:
        return 0
    limit = (min(lens) - 1) // page_size
    first = tables[0]
    n = 0
    while n < limit and all(t[n] == first[n] for t in tables):
        n += 1
    return n if n >= MIN_SHARED_PAGES else 0


def _partial(
    q: torch.Tensor,  # [..., R, D]
    k: torch.Tensor,  # [..., N, D]
    v: torch.Tensor,  # [..., N, D]
    mask: torch.Tensor | None,  # broadcastable to [..., R, N], True = attend
) -> tuple[torch.Tensor, torch.Tensor]:  # out [..., R, D] float32, lse [..., R, 1] float32
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * (q.shape[-1] ** -0.5)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    probs = (scores - lse).exp().to(v.dtype)
    return torch.matmul(probs, v).float(), lse


def cascade_decode_attention(
    q: torch.Tensor,  # [B, H, D]
    shared_k: torch.Tensor,  # [S, Hkv, D]: the shared pages' keys, gathered once
    shared_v: torch.Tensor,
    own_k: torch.Tensor,  # [B, L, Hkv, D]: each row's remaining pages
    own_v: torch.Tensor,
    own_mask: torch.Tensor,  # [B, 1, 1, L] bool: True = a real token of that row
) -> torch.Tensor:  # [B, H, D]
    B, H, D = q.shape
    Hkv = shared_k.shape[1]
    G = H // Hkv  # query head h uses kv head h // G
    qg = q.view(B, Hkv, G, D)
    q_shared = qg.transpose(0, 1).reshape(Hkv, B * G, D)  # every row's queries against one K/V
    # head-major contiguous K/V: matmul then reads them through BLAS without another copy
    out_s, lse_s = _partial(q_shared, shared_k.transpose(0, 1).contiguous(), shared_v.transpose(0, 1).contiguous(), None)
    out_s = out_s.view(Hkv, B, G, D).transpose(0, 1)  # [B, Hkv, G, D]
    lse_s = lse_s.view(Hkv, B, G, 1).transpose(0, 1)
    out_u, lse_u = _partial(qg, own_k.permute(0, 2, 1, 3).contiguous(), own_v.permute(0, 2, 1, 3).contiguous(), own_mask)
    return merge_partials(out_s, lse_s, out_u, lse_u).to(q.dtype).reshape(B, H, D)


def merge_partials(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Attention over two disjoint key sets from each one's output [..., D] and log-sum-exp
    [..., 1] (the formula above, shifted by the larger lse so exp never overflows); float32."""
    top = torch.maximum(lse_a, lse_b)
    w_a, w_b = (lse_a - top).exp(), (lse_b - top).exp()
    return (out_a.float() * w_a + out_b.float() * w_b) / (w_a + w_b)
