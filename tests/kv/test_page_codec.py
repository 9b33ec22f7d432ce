"""PageCodec: a value round-trips; truncated, corrupt and foreign values are misses, never pages."""
from __future__ import annotations

import os

import pytest

from kvstrata.kv.hashing import namespace_root
from kvstrata.kv.page_codec import HEADER_BYTES, PageCodec

ROOT = namespace_root("tiny", "float32", 16, "llama-paged-v1")
PAGE_BYTES = 2 * 2 * 16 * 2 * 8 * 4  # [2, layers=2, ps=16, kvh=2, hd=8] float32


def codec(namespace: bytes = ROOT, dtype: str = "float32", page_size: int = 16) -> PageCodec:
    return PageCodec(namespace, page_size, 2, 2, 8, dtype, PAGE_BYTES)


KEY = bytes(range(32))
PAYLOAD = os.urandom(PAGE_BYTES)


def test_round_trip_gives_the_same_bytes() -> None:
    c = codec()
    value = c.encode(KEY, PAYLOAD)
    assert len(value) == c.value_bytes == HEADER_BYTES + PAGE_BYTES + 4
    payload, miss = c.decode(KEY, value)
    assert miss is None and bytes(payload) == PAYLOAD


def test_absent_is_a_plain_miss() -> None:
    assert codec().decode(KEY, None) == (None, None)


@pytest.mark.parametrize("cut", [0, 10, HEADER_BYTES, HEADER_BYTES + 100, -1])
def test_truncated_is_a_miss(cut: int) -> None:
    value = codec().encode(KEY, PAYLOAD)
    payload, miss = codec().decode(KEY, value[:cut])
    assert payload is None and miss == "truncated"


@pytest.mark.parametrize("where", [0, HEADER_BYTES + 5, HEADER_BYTES + PAGE_BYTES - 1, HEADER_BYTES + PAGE_BYTES + 1])
def test_a_flipped_bit_is_a_corrupt_miss(where: int) -> None:
    value = bytearray(codec().encode(KEY, PAYLOAD))
    value[where] ^= 0x10
    payload, miss = codec().decode(KEY, bytes(value))
    assert payload is None and miss == "corrupt"


def test_values_of_another_model_dtype_page_size_or_key_are_foreign() -> None:
    value = codec().encode(KEY, PAYLOAD)
    other_model = codec(namespace=namespace_root("other", "float32", 16, "llama-paged-v1"))
    assert other_model.decode(KEY, value) == (None, "foreign")
    assert codec(dtype="bfloat16").decode(KEY, value) == (None, "foreign")
    assert PageCodec(ROOT, 8, 2, 2, 8, "float32", PAGE_BYTES).decode(KEY, value) == (None, "foreign")
    assert codec().decode(bytes(32), value) == (None, "foreign")  # the value of another key


def test_payload_of_the_wrong_size_is_refused() -> None:
    with pytest.raises(ValueError, match="bytes"):
        codec().encode(KEY, PAYLOAD[:-1])
