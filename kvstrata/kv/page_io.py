"""Copying whole KV pages between the L1 pool and page-major host tensors.

The pool keeps one tensor per layer, k[layer] / v[layer]: [num_pages * page_size, kv_heads, head_dim].
L2 and L3 keep pages page-major, so one page is one contiguous run of bytes (an L3 value payload):
    host: [n, 2, layers, page_size, kv_heads, head_dim]   (2 = K, V)
"""
from __future__ import annotations

import torch

from kvstrata.kv.pool import PagePool


def page_shape(pool: PagePool) -> tuple[int, ...]:
    """One page, page-major: [2, layers, page_size, kv_heads, head_dim]."""
    _, kv_heads, head_dim = pool.k[0].shape
    return (2, pool.layers, pool.page_size, kv_heads, head_dim)


def _rows(t: torch.Tensor, page_size: int) -> torch.Tensor:
    # [num_slots, kv_heads, head_dim] -> [num_pages, page_size * kv_heads * head_dim] (a view)
    return t.view(-1, page_size * t.shape[1] * t.shape[2])


# Both directions index contiguous 2-D views only (one row = one page of one layer's K or V), so
# torch copies whole rows with memcpy instead of walking strided elements (several times faster).
# A host tensor [n, 2, layers, ...] is viewed as rows [n * 2 * layers, page]: row = i * 2L + kv * L + layer.


def read_pages(pool: PagePool, pages: list[int], out: torch.Tensor, rows: list[int]) -> None:
    """out[rows[i]] = pool page pages[i], for a host tensor `out` [n, 2, layers, ps, kvh, hd]."""
    if not pages:
        return
    src = torch.tensor(pages, dtype=torch.long, device=pool.k[0].device)
    base = torch.tensor(rows, dtype=torch.long) * (2 * pool.layers)
    flat = out.view(-1, out[0, 0, 0].numel())
    for kv, tensors in enumerate((pool.k, pool.v)):
        for layer in range(pool.layers):
            gathered = _rows(tensors[layer], pool.page_size).index_select(0, src)  # [N, page]
            flat.index_copy_(0, base + (kv * pool.layers + layer), gathered.to(out.device))


def write_pages(pool: PagePool, pages: list[int], src: torch.Tensor, rows: list[int]) -> None:
    """pool page pages[i] = src[rows[i]], for a host tensor `src` [n, 2, layers, ps, kvh, hd]."""
    if not pages:
        return
    device = pool.k[0].device
    dst = torch.tensor(pages, dtype=torch.long, device=device)
    base = torch.tensor(rows, dtype=torch.long) * (2 * pool.layers)
    flat = src.view(-1, src[0, 0, 0].numel())
    for kv, tensors in enumerate((pool.k, pool.v)):
        for layer in range(pool.layers):
            gathered = flat.index_select(0, base + (kv * pool.layers + layer))  # [N, page]
            _rows(tensors[layer], pool.page_size).index_copy_(0, dst, gathered.to(device, non_blocking=True))


def snapshot_pages(pool: PagePool, pages: list[int]) -> torch.Tensor:
    """A new CPU tensor [len(pages), 2, layers, ps, kvh, hd] holding copies of the pages."""
    out = torch.empty((len(pages), *page_shape(pool)), dtype=pool.k[0].dtype)
    read_pages(pool, pages, out, list(range(len(pages))))
    return out
