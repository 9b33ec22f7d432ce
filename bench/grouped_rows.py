"""What reading a request's K/V once for all its verify rows saves, offline: the paged decode kernel
(kvstrata/model/csrc/paged_decode.cpp) over R rows, each one token longer, on the same pages (a verify
step's rows: grouped, one pass over the context) against the same rows on copies of those pages (each row
its own pass, as before grouping). SmolLM2's heads (9 query, 3 KV, head size 64), float32 K/V, 30 calls a
step as its 30 layers make; the best of `--repeat` (2) medians of 5 timed steps after 2 untimed. `--shape` takes
another model's heads and layers: llama1b (Llama 3.2 1B: 32 query, 8 KV, head size 64, 16 layers),
llama8b (Llama 3 8B: 32, 8, head size 128, 32 layers) or qwen3-0.6b (16, 8, head size 128, 28 layers).

    .venv/bin/python bench/grouped_rows.py [--contexts 1000,3000] [--rows 1,2,4,8,16] [--dtype bfloat16]
                                           [--grouped-only] [--shape smollm2|llama1b|llama8b|qwen3-0.6b] [--streamed]
                                           [--repeat 2]

One K/V tensor serves all 30 calls, so it stays in the CPU's caches: the figures are the kernel's
arithmetic and cache reads, not a whole model's K/V streamed from memory (`--streamed`: a K/V a layer).
"""
from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, ".")
from kvstrata.model import cpu_kernels  # noqa: E402
from verify_rows import timed  # noqa: E402  (bench/, this script's folder: median ms after two untimed runs)

PS = 16
SHAPES = {"smollm2": (9, 3, 64, 30), "llama1b": (32, 8, 64, 16), "llama8b": (32, 8, 128, 32),
          "qwen3-0.6b": (16, 8, 128, 28)}  # heads, KV, D, layers


def step_ms(ctx: int, rows: int, grouped: bool, heads: int = 9, kv_heads: int = 3, dim: int = 64,
            layers: int = 30, dtype: torch.dtype = torch.float32, streamed: bool = False) -> float:
    npg = -(-(ctx + rows) // PS)
    kv = []
    for _ in range(layers if streamed else 1):  # streamed: each layer its own K/V, read from memory as a model's
        k = torch.randn(npg * (1 if grouped else rows) * PS, kv_heads, dim).to(dtype)
        kv.append((k, torch.randn_like(k)))
    pages = torch.stack([torch.arange(npg) + (0 if grouped else r * npg) for r in range(rows)])
    lens = torch.arange(ctx + 1, ctx + rows + 1)
    q = torch.randn(rows, heads, dim).to(dtype)

    def step() -> None:
        for layer in range(layers):
            k, v = kv[layer % len(kv)]
            cpu_kernels.paged_decode(q, k, v, pages, lens, PS)

    return timed(step, 5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="1000,3000")
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--grouped-only", action="store_true")
    ap.add_argument("--shape", default="smollm2", choices=sorted(SHAPES))
    ap.add_argument("--streamed", action="store_true", help="each layer its own K/V (out of the CPU's caches)")
    ap.add_argument("--repeat", type=int, default=2, help="medians taken; the best is printed (and their median)")
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    heads, kv_heads, dim, layers = SHAPES[a.shape]
    shape = {"heads": heads, "kv_heads": kv_heads, "dim": dim, "layers": layers, "dtype": dtype, "streamed": a.streamed}
    assert cpu_kernels.load_kernels(), "the C++ kernels did not build"
    for ctx in map(int, a.contexts.split(",")):
        for r in map(int, a.rows.split(",")):
            runs = sorted(step_ms(ctx, r, True, **shape) for _ in range(a.repeat))
            grouped = runs[0]
            if a.grouped_only:
                print(f"context {ctx}, {r} rows: one request's rows {grouped:.2f} ms a step (median of {a.repeat} "
                      f"{runs[len(runs) // 2]:.2f}; {a.shape}, {layers} layers, {a.dtype})")
                continue
            own = min(step_ms(ctx, r, False, **shape) for _ in range(a.repeat))
            print(f"context {ctx}, {r} rows: each row its own pages {own:.2f} ms, one request's rows {grouped:.2f} ms "
                  f"a step ({a.shape}, {layers} layers, {a.dtype})")


if __name__ == "__main__":
    main()
