"""What a decode or verify step's quantized linears cost by row count, offline: `int_dot_linear`
(kvstrata/model/csrc/int_dot_linear.cpp) on random q4 weights of SmolLM2's shapes (fused q/k/v 960 x 576,
o 576 x 576, fused gate/up 3072 x 576, down 576 x 1536), 16-bit activations, 30 layers a step; the median
of 15 timed steps after 2 untimed. Calls of 4 rows or more take the AMX form where the CPU has it, fewer
the VNNI/AVX2 one (`torch.ops.kvstrata.int_dot_isa()` says which this build runs).

    .venv/bin/python bench/linear_rows.py [--rows 1,4,8,16]
"""
from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, ".")
from kvstrata.model import cpu_kernels  # noqa: E402
from kvstrata.model.quant import int_dot  # noqa: E402
from kvstrata.model.quant.blocks import IntWeight  # noqa: E402
from verify_rows import timed  # noqa: E402  (bench/, this script's folder: median ms after two untimed runs)

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # (out, in) of a SmolLM2 layer's linears


def q4(g: torch.Generator, n: int, k: int) -> torch.Tensor:
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scale = torch.rand(n, k // 32, generator=g) * 0.02
    return int_dot.pack(IntWeight(q, scale, -8 * scale, 4, 32, 8))


def step_ms(rows: int, weights: list[torch.Tensor], layers: int = 30) -> float:
    g = torch.Generator().manual_seed(rows)
    xs = {k: torch.randn(rows, k, generator=g).bfloat16() for _, k in SHAPES}

    def step() -> None:
        for _ in range(layers):
            for (_, k), w in zip(SHAPES, weights):
                int_dot.linear(xs[k], [w], 16)

    return timed(step, 15)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,4,8,16")
    a = ap.parse_args()
    assert cpu_kernels.load_kernels(), "the C++ kernels did not build"
    g = torch.Generator().manual_seed(0)
    weights = [q4(g, n, k) for n, k in SHAPES]
    print(f"int_dot form: {torch.ops.kvstrata.int_dot_isa()} (4 rows or more; fewer on VNNI/AVX2)")
    for r in map(int, a.rows.split(",")):
        print(f"{r} rows: SmolLM2's linears {step_ms(r, weights):.2f} ms a step (30 layers, q4, 16-bit activations)")


if __name__ == "__main__":
    main()
