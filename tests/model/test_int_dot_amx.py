"""A row's integer-dot results do not depend on the rows beside it (csrc/int_dot_amx.h, csrc/int8_head.cpp):
calls of 4 rows or more run on AMX tiles where the CPU has them (17-32 rows as two blocks a pass), fewer on VNNI/AVX2, and a verify step's
rows must give the bits their one-row steps give (engine/spec/: greedy output the same with drafts). On a
CPU without AMX the same checks hold across the VNNI/AVX2 passes of 8 (or 4) rows."""
from __future__ import annotations

import pytest
import torch

from kvstrata.model import cpu_kernels
from kvstrata.model.quant import int_dot
from kvstrata.model.quant.blocks import IntWeight, KScales
from kvstrata.model.quant.int8_head import Int8HeadPack

ROWS = 40  # a 32-row pass (two 16-row tile blocks on one walk of the weights) and an 8-row one


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    assert cpu_kernels.load_kernels(), "the C++ kernels did not build (see the log)"


def packed_weights(g: torch.Generator, n: int, k: int) -> dict[str, torch.Tensor]:
    """The formats AMX runs (q4, q4s, q4k, q8, q8s), packed."""
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    q8 = torch.randint(0, 256, (n, k), generator=g, dtype=torch.uint8)
    scale, bias = torch.rand(n, k // 32, generator=g) * 0.02, torch.randn(n, k // 32, generator=g) * 0.05
    d, dmin = ((torch.rand(n, k // 256, generator=g) * 2e-3).half().float() for _ in range(2))
    sc, m = (torch.randint(0, 64, (n, k // 32), generator=g, dtype=torch.uint8) for _ in range(2))
    ks = KScales(d, dmin, sc, m)
    return {"q4": int_dot.pack(IntWeight(q, scale, bias, 4, 32)),
            "q4s": int_dot.pack(IntWeight(q, scale, -8 * scale, 4, 32, 8)),
            "q4k": int_dot.pack(IntWeight(q, d.repeat_interleave(8, 1) * sc.float(),
                                          -dmin.repeat_interleave(8, 1) * m.float(), 4, 32, 0, ks)),
            "q8": int_dot.pack(IntWeight(q8, scale, bias, 8, 32)),
            "q8s": int_dot.pack(IntWeight(q8, scale, -128 * scale, 8, 32, 128))}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("act_bits", [16, 8])
def test_a_linear_row_has_the_same_bits_in_any_call(dtype: torch.dtype, act_bits: int) -> None:
    g = torch.Generator().manual_seed(1)
    for name, packed in packed_weights(g, 96, 512).items():
        x = (torch.randn(ROWS, 512, generator=g) * 3).to(dtype)
        alone = torch.cat([int_dot.linear(x[r:r + 1], [packed], act_bits) for r in range(ROWS)])
        for rows in (4, 7, 16, 20, 32, ROWS):
            together = int_dot.linear(x[:rows], [packed], act_bits)
            assert torch.equal(together, alone[:rows]), f"{name}: {rows} rows differ from one at a time"


def test_a_head_row_has_the_same_bits_in_any_call() -> None:
    g = torch.Generator().manual_seed(2)
    for v, k in ((80, 64), (4096, 576)):  # one block pair's tail (80 = 5 blocks of 16), SmolLM2's width
        w = torch.randint(-127, 128, (v, k), generator=g, dtype=torch.int8)
        pack = Int8HeadPack.of(w, torch.rand(v, generator=g) * 0.01)
        x = torch.randn(ROWS, k, generator=g)

        def logits(rows: torch.Tensor) -> torch.Tensor:
            return torch.ops.kvstrata.int8_head_logits(rows, pack.packed, pack.wsum, pack.wscale)

        alone = torch.cat([logits(x[r:r + 1]) for r in range(ROWS)])
        for rows in (4, 9, 16, ROWS):
            assert torch.equal(logits(x[:rows]), alone[:rows]), f"head {v}x{k}: {rows} rows differ from one at a time"
        # and the dots are the exact integers: rows of integers up to 127 quantize to themselves (scale 1)
        xi = torch.randint(-127, 128, (ROWS, k), generator=g).float()
        xi[:, 0] = 127
        want = (xi @ w.float().T) * pack.wscale  # exact in float32: |sums| < 2^24
        assert torch.equal(logits(xi), want)
