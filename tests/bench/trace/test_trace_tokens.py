"""Hash id -> token blocks: same id same tokens, different ids different tokens, prefixes kept."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstrata.bench.trace.format import TraceRequest
from kvstrata.bench.trace.tokens import TOKEN_HIGH, TOKEN_LOW, BlockTokens


def r(n_in: int, ids: tuple[int, ...]) -> TraceRequest:
    return TraceRequest(1, 0.0, n_in, 8, ids)


def test_same_id_same_tokens_across_instances_and_different_ids_differ() -> None:
    a, b = BlockTokens(16), BlockTokens(16)
    assert a.block(42) == b.block(42) and len(a.block(42)) == 16
    blocks = {tuple(a.block(h)) for h in range(5000)}
    assert len(blocks) == 5000
    assert all(TOKEN_LOW <= t < TOKEN_HIGH for blk in blocks for t in blk)
    assert BlockTokens(16, seed=1).block(42) != a.block(42)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 29000**2 - 1), st.integers(0, 29000**2 - 1), st.integers(2, 64))
def test_distinct_ids_give_distinct_blocks(h1: int, h2: int, block: int) -> None:
    m = BlockTokens(block)
    assert (m.block(h1) == m.block(h2)) == (h1 == h2)


def test_prompt_length_scales_and_cuts_the_last_block() -> None:
    m = BlockTokens(16)
    p = m.prompt(r(1100, (1, 2, 3)))  # 512 + 512 + 76 -> 16 + 16 + ceil(76 / 32) = 3
    assert len(p) == 35 == m.scaled_length(1100)
    assert p == m.block(1) + m.block(2) + m.block(3)[:3]
    assert len(m.prompt(r(1024, (1, 2)))) == 32 and len(m.prompt(r(1, (9,)))) == 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=6, unique=True),
       st.lists(st.integers(51, 99), max_size=6, unique=True), st.integers(1, 32))
def test_requests_sharing_leading_ids_share_exactly_that_prefix(shared: list[int], tail: list[int], block: int) -> None:
    m = BlockTokens(block)
    a = m.prompt(r(512 * (len(shared) + 1), (*shared, 1000)))
    b = m.prompt(r(512 * (len(shared) + len(tail)), (*shared, *tail)))
    k = len(shared) * block
    assert a[:k] == b[:k]
    if tail and block >= 1:
        assert a[k] != b[k]  # the next block differs from its first token
