"""Paged decode over a bf16 cache (csrc/paged_decode_amx.h where the CPU has AMX-BF16, the float32 FMA form
elsewhere): a verify group's rows match dense attention and each row gets the bits it gets alone, also where
a row sees none of a span's or a block's tokens (its state must pass through untouched: -inf scores, zero
weights), at every head size, with pages of 16 tokens and of 1 (K rows not 16 to a page); and the outputs
are the bf16 rounding of the exact attention (the AMX form's weights keep 16 bits: a high part and a rest)."""
from __future__ import annotations

import pytest
import torch

from kvstrata.model import cpu_kernels
from kvstrata.model.attention import gather_pages, grouped_decode_attention


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    assert cpu_kernels.load_kernels(), "the C++ kernels did not build (see the log)"


def group(first: int, rows: int, heads: int, kv_heads: int, dim: int, page_size: int, seed: int):
    """`rows` rows of one request, lengths first .. first + rows - 1, on the same scattered pages."""
    g = torch.Generator().manual_seed(seed)
    need = -(-(first + rows) // page_size)
    num_pages = need + 3
    k = torch.randn(num_pages * page_size, kv_heads, dim, generator=g).bfloat16()
    v = torch.randn(num_pages * page_size, kv_heads, dim, generator=g).bfloat16()
    table = torch.randperm(num_pages, generator=g)[:need]
    pages = table.repeat(rows, 1)
    lens = torch.arange(first, first + rows, dtype=torch.long)
    q = torch.randn(rows, heads, dim, generator=g).bfloat16()
    return q, k, v, pages, lens


@pytest.mark.parametrize("dim", cpu_kernels.HEAD_DIMS)
@pytest.mark.parametrize("first,rows,page_size", [(256, 16, 16), (250, 21, 16), (31, 5, 1), (1, 3, 16)])
def test_a_verify_group_matches_dense_attention_and_each_row_alone(dim: int, first: int, rows: int,
                                                                    page_size: int) -> None:
    # 256: the first row ends at a span boundary (256 tokens), so it sees none of the next span; 250 + 21:
    # rows end on both sides of it and of a 32-token block; 21 rows x 3 heads = 63 queries (4 tile passes)
    heads, kv_heads = (9, 3) if dim <= 64 else (8, 2)  # 16 rows: 48 or 64 queries (K^T), one row: 3 or 4 (scores
    # transposed, paged_decode_amx.h), so a row alone and in its group take the two ways at head sizes 64 and 128
    q, k, v, pages, lens = group(first, rows, heads, kv_heads, dim, page_size, seed=dim + first)
    got = cpu_kernels.paged_decode(q, k, v, pages, lens, page_size)
    mask = (torch.arange(pages.shape[1] * page_size)[None, :] < lens[:, None])[:, None, None, :]
    want = grouped_decode_attention(q.double(), gather_pages(k, pages, page_size).double(),
                                    gather_pages(v, pages, page_size).double(), mask)
    torch.testing.assert_close(got.double(), want, atol=2e-2, rtol=2e-2)  # bf16 output
    assert (got.double() - want).abs().mean() < 2e-3
    for i in range(rows):
        alone = cpu_kernels.paged_decode(q[i : i + 1], k, v, pages[i : i + 1], lens[i : i + 1], page_size)
        assert torch.equal(alone[0], got[i]), (i, int(lens[i]))


@pytest.mark.parametrize("sharpness", [1.0, 3.0, 6.0])
def test_outputs_are_the_rounded_exact_attention(sharpness: float) -> None:
    # the weights keep 16 bits (a bf16 high part and a bf16 rest): nearly every output is the bf16 rounding of
    # the exact value (weights rounded to bf16 alone missed by an ulp in 9-43% of them over 3k tokens)
    g = torch.Generator().manual_seed(int(sharpness))
    ctx, ps = 3000, 16
    num_pages = -(-ctx // ps)
    k = torch.randn(num_pages * ps, 3, 64, generator=g).bfloat16()
    v = torch.randn(num_pages * ps, 3, 64, generator=g).bfloat16()
    q = (torch.randn(1, 9, 64, generator=g) * sharpness).bfloat16()
    pages, lens = torch.arange(num_pages)[None], torch.tensor([ctx])
    got = cpu_kernels.paged_decode(q, k, v, pages, lens, ps)
    mask = (torch.arange(num_pages * ps)[None, :] < lens[:, None])[:, None, None, :]
    exact = grouped_decode_attention(q.double(), gather_pages(k, pages, ps).double(),
                                     gather_pages(v, pages, ps).double(), mask)
    assert (got != exact.bfloat16()).float().mean() < 0.01
