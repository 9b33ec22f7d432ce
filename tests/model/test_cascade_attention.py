"""Cascade decode attention equals the plain per-row attention over the same page tables."""
from __future__ import annotations

import pytest
import torch

from kvstrata.model.attention import gather_pages, grouped_decode_attention
from kvstrata.model.cascade_attention import MIN_SHARED_PAGES, cascade_decode_attention, shared_leading_pages

PS = 4


def test_shared_leading_pages() -> None:
    shared = list(range(10, 10 + MIN_SHARED_PAGES + 2))
    tables = [shared + [1, 2], shared + [3], shared + [4, 5, 6]]
    lens = [len(t) * PS for t in tables]
    assert shared_leading_pages(tables, lens, PS) == len(shared)
    # a row whose context ends exactly at the last shared page keeps that page as its own
    assert shared_leading_pages([shared, shared + [7]], [len(shared) * PS, (len(shared) + 1) * PS], PS) == len(shared) - 1
    assert shared_leading_pages([shared + [1]], [30], PS) == 0  # one row: nothing to share
    short = shared[: MIN_SHARED_PAGES - 1]
    assert shared_leading_pages([short + [1], short + [2]], [16, 16], PS) == 0  # too few to pay off
    assert shared_leading_pages([[1] + shared, [2] + shared], [40, 40], PS) == 0  # must be leading


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_cascade_equals_plain(dtype: torch.dtype, tol: float) -> None:
    torch.manual_seed(0)
    H, Hkv, D, num_pages = 6, 2, 16, 64
    k_cache = torch.randn(num_pages * PS, Hkv, D, dtype=dtype)
    v_cache = torch.randn(num_pages * PS, Hkv, D, dtype=dtype)
    shared = [7, 3, 30, 12, 50]
    own = [[1, 2, 9], [4], [5, 6, 8, 11]]
    tables = [shared + o for o in own]
    lens = [len(t) * PS - i for i, t in enumerate(tables)]  # ragged last pages
    pmax = max(len(t) for t in tables)
    pages = torch.tensor([t + [0] * (pmax - len(t)) for t in tables])
    mask = (torch.arange(pmax * PS)[None, :] < torch.tensor(lens)[:, None])[:, None, None, :]
    q = torch.randn(len(tables), H, D, dtype=dtype)
    want = grouped_decode_attention(q, gather_pages(k_cache, pages, PS), gather_pages(v_cache, pages, PS), mask)
    c = shared_leading_pages(tables, lens, PS)
    assert c == len(shared)
    got = cascade_decode_attention(
        q, gather_pages(k_cache, pages[0, :c], PS), gather_pages(v_cache, pages[0, :c], PS),
        gather_pages(k_cache, pages[:, c:], PS), gather_pages(v_cache, pages[:, c:], PS), mask[..., c * PS :],
    )
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
