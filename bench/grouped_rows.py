"""What reading a request's K/V once for all its verify rows saves, offline: the paged decode kernel
(kvstrata/model/csrc/paged_decode.cpp) over R rows, each one token longer, on the same pages (a verify
step's rows: grouped, one pass over the context) against the same rows on copies of those pages (each row
its own pass, as before grouping). SmolLM2's heads (9 query, 3 KV, head size 64), float32 K/V, 30 calls a
step as its 30 layers make; the best of two medians of 5 timed steps after 2 untimed.

    .venv/bin/python bench/grouped_rows.py [--contexts 1000,3000] [--rows 1,2,4,8,16]

One K/V tensor serves all 30 calls, so it stays in the CPU's caches: the figures are the kernel's
arithmetic and cache reads, not a whole model's K/V streamed from memory.
"""
from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, ".")
from kvstrata.model import cpu_kernels  # noqa: E402
from verify_rows import timed  # noqa: E402  (bench/, this script's folder: median ms after two untimed runs)

PS = 16


def step_ms(ctx: int, rows: int, grouped: bool, heads: int = 9, kv_heads: int = 3, dim: int = 64,
            layers: int = 30, dtype: torch.dtype = torch.float32) -> float:
    npg = -(-(ctx + rows) // PS)
    k = torch.randn(npg * (rows + 1) * PS, kv_heads, dim).to(dtype)
    v = torch.randn_like(k)
    pages = torch.stack([torch.arange(npg) + (0 if grouped else r * npg) for r in range(rows)])
    lens = torch.arange(ctx + 1, ctx + rows + 1)
    q = torch.randn(rows, heads, dim).to(dtype)

    def step() -> None:
        for _ in range(layers):
            cpu_kernels.paged_decode(q, k, v, pages, lens, PS)

    return timed(step, 5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="1000,3000")
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--grouped-only", action="store_true")
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    assert cpu_kernels.load_kernels(), "the C++ kernels did not build"
    for ctx in map(int, a.contexts.split(",")):
        for r in map(int, a.rows.split(",")):
            grouped = min(step_ms(ctx, r, True, dtype=dtype), step_ms(ctx, r, True, dtype=dtype))
            if a.grouped_only:
                print(f"context {ctx}, {r} rows: one request's rows {grouped:.2f} ms a step (30 layers, {a.dtype})")
                continue
            own = min(step_ms(ctx, r, False, dtype=dtype), step_ms(ctx, r, False, dtype=dtype))
            print(f"context {ctx}, {r} rows: each row its own pages {own:.2f} ms, one request's rows {grouped:.2f} ms "
                  f"a step (30 layers, {a.dtype})")


if __name__ == "__main__":
    main()
