"""GGUF blocks unpacked into integers, scales and biases (kvstrata/model/quant/blocks.py): every type
gives exactly the values the `gguf` package's own dequantize gives."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from kvstrata.model.quant.blocks import BLOCK_TYPES, block_type, decode_blocks

from quant_support import random_raw


@pytest.mark.parametrize("type_name", sorted(BLOCK_TYPES))
def test_decode_equals_gguf_dequantize(type_name: str) -> None:
    n, k = 32, 512
    raw = random_raw(type_name, n, k, seed=3)
    w = decode_blocks(raw, type_name, (n, k))
    _, _, bits, group = BLOCK_TYPES[type_name]
    assert w.q.dtype == torch.uint8 and int(w.q.max()) < 2**bits and int(w.q.max()) >= 2**bits - 2
    assert w.scale.shape == (n, k // group) and w.bias.shape == (n, k // group)
    want = dequantize(raw, GGMLQuantizationType[type_name]).reshape(n, k)
    assert np.array_equal(w.dequantize().numpy(), want)  # bit-exact
    part = decode_blocks(raw[5:9], type_name, (n, k))  # a slice of rows decodes alone
    assert torch.equal(part.q, w.q[5:9]) and torch.equal(part.scale, w.scale[5:9])


def test_rows_permutes_everything() -> None:
    w = decode_blocks(random_raw("Q4_K", 16, 256), "Q4_K", (16, 256))
    order = torch.randperm(16)
    assert torch.equal(w.rows(order).dequantize(), w.dequantize()[order])


def test_types_and_shapes_it_declines() -> None:
    assert block_type("Q4_K", (16, 256)) is not None
    assert block_type("Q4_K", (16, 576)) is None  # K-quant rows are whole super-blocks of 256
    assert block_type("Q2_K", (16, 256)) is None and block_type("F16", (16, 256)) is None
    assert block_type("Q8_0", (256,)) is None  # a vector, not a matrix
    with pytest.raises(ValueError, match="not a block type"):
        decode_blocks(np.zeros((1, 84), np.uint8), "Q2_K", (1, 256))
