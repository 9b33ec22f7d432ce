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


def test_rows_read_from_the_file_equal_the_mapped_ones(tmp_path: Path) -> None:
    """`read` (a prompt's embedding: pread, not the map, whose faults map the 64 KiB around each row) gives
    the mapped rows' values, repeats and order kept; ids outside fail."""
    rows, columns = 300, 64
    raw = np.random.default_rng(0).integers(0, 256, (rows, columns // 32 * 34), dtype=np.uint8)
    raw.reshape(rows, -1, 34)[:, :, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)  # finite scales
    path = tmp_path / "m.bin"
    path.write_bytes(b"\x07" * 96 + raw.tobytes())
    reader = GgufRows(path, 96, raw.nbytes, "Q8_0", (rows, columns))
    ids = torch.tensor(np.random.default_rng(1).integers(0, rows, 200))
    ids[5] = ids[6] = 299
    mapped = reader(ids)
    assert mapped.abs().max() > 0
    assert torch.equal(reader.read(ids), mapped)
    assert reader.read(torch.tensor([], dtype=torch.int64)).shape == (0, columns)
    with pytest.raises(IndexError):
        reader.read(torch.cat([ids, torch.tensor([rows])]))
