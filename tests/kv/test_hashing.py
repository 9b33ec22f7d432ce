from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvstrata.kv.hashing import (
    hash_pages,
    hash_to_int64,
    namespace_root,
    token_bytes,
    tokens_from_bytes,
)

ROOT = namespace_root("org/model@rev", "bfloat16", 4, "nhd")
tokens_st = st.lists(st.integers(0, 2**32 - 1), max_size=40)


def test_chain_matches_definition() -> None:
    tokens = [1, 2, 3, 4, 70000, 6, 7, 8, 9]
    h0 = hashlib.sha256(ROOT + struct.pack("<4I", 1, 2, 3, 4) + b"salt").digest()
    h1 = hashlib.sha256(h0 + struct.pack("<4I", 70000, 6, 7, 8) + b"salt").digest()
    assert hash_pages(tokens, 4, ROOT, "salt") == [h0, h1]


@given(tokens_st, st.integers(1, 6))
def test_one_hash_per_full_page_and_partial_page_unhashed(tokens: list[int], page_size: int) -> None:
    hashes = hash_pages(tokens, page_size, ROOT)
    assert len(hashes) == len(tokens) // page_size
    full = len(tokens) - len(tokens) % page_size
    assert hash_pages(tokens[:full], page_size, ROOT) == hashes
    assert all(len(h) == 32 for h in hashes)


@given(tokens_st, st.integers(0, 40), st.integers(1, 6))
def test_prefix_stable_and_continuable(tokens: list[int], cut: int, page_size: int) -> None:
    hashes = hash_pages(tokens, page_size, ROOT, "k")
    assert hash_pages(tokens[:cut], page_size, ROOT, "k") == hashes[: cut // page_size]
    pages = min(cut, len(tokens)) // page_size
    if pages:
        rest = hash_pages(tokens[pages * page_size :], page_size, ROOT, "k", parent=hashes[pages - 1])
        assert rest == hashes[pages:]


@given(st.lists(st.integers(0, 1000), min_size=4, max_size=40))
def test_extra_key_and_root_change_every_hash(tokens: list[int]) -> None:
    plain = hash_pages(tokens, 4, ROOT)
    for other in (
        hash_pages(tokens, 4, ROOT, "tenant-a"),
        hash_pages(tokens, 4, namespace_root("org/other", "bfloat16", 4, "nhd")),
    ):
        assert len(other) == len(plain)
        assert all(a != b for a, b in zip(plain, other))
    assert hash_pages(tokens, 4, ROOT, "") == plain  # "" means no salt, like None


def test_different_tokens_diverge_from_that_page_on() -> None:
    a = hash_pages(list(range(12)), 4, ROOT)
    b = hash_pages(list(range(5)) + [99] + list(range(6, 12)), 4, ROOT)
    assert a[0] == b[0] and a[1] != b[1] and a[2] != b[2]


def test_namespace_root_separates_every_field() -> None:
    roots = {
        namespace_root("m", "bf16", 16, "nhd"),
        namespace_root("m2", "bf16", 16, "nhd"),
        namespace_root("m", "fp16", 16, "nhd"),
        namespace_root("m", "bf16", 32, "nhd"),
        namespace_root("m", "bf16", 16, "hnd"),
        namespace_root("mb", "f16", 16, "nhd"),  # same concatenation as ("m", "bf16")
    }
    assert len(roots) == 6
    assert namespace_root("m", "bf16", 16, "nhd") == namespace_root("m", "bf16", 16, "nhd")


def test_token_bytes_inputs() -> None:
    tokens = [0, 1, 2**31, 2**32 - 1]
    data = token_bytes(tokens)
    assert data == struct.pack("<4I", *tokens)
    assert token_bytes(np.array(tokens, dtype=np.int64)) == data
    assert token_bytes(torch.tensor([0, 1, 7])) == struct.pack("<3I", 0, 1, 7)
    assert token_bytes(range(3)) == struct.pack("<3I", 0, 1, 2)
    assert tokens_from_bytes(data) == tokens
    with pytest.raises(ValueError):
        token_bytes([-1])
    with pytest.raises(ValueError):
        token_bytes([2**32])


def test_hash_to_int64_is_signed_big_endian_prefix() -> None:
    assert hash_to_int64(bytes([0, 0, 0, 0, 0, 0, 1, 2]) + b"\xff" * 24) == 258
    assert hash_to_int64(b"\xff" * 32) == -1
    assert hash_to_int64(b"\x80" + b"\x00" * 31) == -(2**63)
