"""Rows of a GGUF matrix read from the file (kvstrata/model/quant/gguf_rows.py), for any number of rows."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from kvstrata.model.quant.gguf_rows import GgufRows


@pytest.mark.parametrize("type_name", ["Q6_K", "Q8_0", "Q4_K"])
def test_no_ids_read_no_rows_and_ids_read_theirs(tmp_path: Path, type_name: str) -> None:
    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    rows, columns = 3, 256
    row_bytes = columns // block * block_bytes
    path = tmp_path / "m.bin"
    path.write_bytes(b"\x07" * 64 + bytes(rows * row_bytes))  # zero blocks after a 64-byte header
    reader = GgufRows(path, 64, rows * row_bytes, type_name, (rows, columns))
    empty = reader(torch.tensor([], dtype=torch.int64), torch.bfloat16)
    assert empty.shape == (0, columns) and empty.dtype == torch.bfloat16
    two = reader(torch.tensor([2, 0]))
    assert two.shape == (2, columns) and not np.any(two.numpy())
