"""A wide step's linear three ways: the integer-dot kernel with 16-bit and with 8-bit activations, and the
weight dequantized into a float32 GEMM (what `--prefill-weights dequant` does), on random tiles of a format.

    PYTHONPATH=. python bench/int_prefill.py [--rows 2048] [--shapes 8192x2048,2048x8192] [--repeats 2]
        [--formats q4,q4k,q6s] [--int-only]

Prints ms per call and multiply-adds per second for each; `--prefill-weights auto` takes the tiles for
wide steps only where 8-bit activations make them the fastest (model/quant/plan.py, docs/cpu-kernels.md).
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from kvstrata.model import cpu_kernels  # noqa: E402
from kvstrata.model.quant import int_dot  # noqa: E402


TILE_BYTES = {"q4": 320, "q4s": 288, "q4k": 296, "q5": 384, "q6s": 448, "q8s": 544}  # int_dot_common.h


def random_tiles(n: int, k: int, fmt: str = "q4") -> torch.Tensor:
    """Tiles [n / 16, k / 32, bytes] of a format: random low and high bits, every byte after the low
    plane's 256 read as float16 0.01 (scales, biases); q4k random sc and m bytes, d and -dmin 0.01."""
    size = TILE_BYTES[fmt]
    packed = torch.randint(0, 256, (n // 16, k // 32, size), dtype=torch.uint8)
    if fmt == "q4k":  # runs of 8 tiles of 288 bytes (low plane, sc and m bytes) and then d, -dmin: 2,368 bytes
        supers = packed.view(n // 16, k // 256, 8 * size)
        supers[:, :, 8 * 288:] = torch.full((n // 16, k // 256, 32), 0.01, dtype=torch.float16).view(torch.uint8)
        return packed
    packed[:, :, 256:] = torch.full((n // 16, k // 32, (size - 256) // 2), 0.01, dtype=torch.float16).view(torch.uint8)
    return packed


def timed(fn: Callable[[], torch.Tensor], repeats: int) -> float:
    fn()  # first use: allocations, page faults
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t) / repeats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--shapes", default="8192x2048,2048x8192", help="N x K of each weight (out x in features)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--formats", default="q4", help=f"tile formats, comma-separated: {', '.join(TILE_BYTES)}")
    ap.add_argument("--int-only", action="store_true", help="only the integer kernel at 8-bit activations")
    a = ap.parse_args()
    assert cpu_kernels.load_kernels(), "the C++ kernels did not build"
    print(f"kernel form {cpu_kernels.int_dot_isa()}, {torch.get_num_threads()} threads, {a.rows} rows")
    for fmt in a.formats.split(","):
        for shape in a.shapes.split(","):
            n, k = (int(v) for v in shape.split("x"))
            packed, x = random_tiles(n, k, fmt), torch.randn(a.rows, k)
            forms: dict[str, Callable[[], torch.Tensor]] = {
                "int_dot 16-bit": lambda: int_dot.linear(x, [packed], 16),
                "int_dot 8-bit": lambda: int_dot.linear(x, [packed], 8),
                "dequant + F.linear": lambda: F.linear(x, int_dot.dequantize(packed, torch.float32)),
            }
            for name, fn in forms.items():
                if a.int_only and name != "int_dot 8-bit":
                    continue
                dt = timed(fn, a.repeats)
                print(f"{fmt} {n}x{k} {name}: {dt * 1e3:.1f} ms, {n * k * a.rows / dt / 1e9:.1f} GMAC/s")


if __name__ == "__main__":
    main()
