"""Rows of a GGUF matrix read from the file (kvstrata/model/quant/gguf_rows.py), for any number of rows, never
through the map."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from kvstrata.model import cpu_kernels
from kvstrata.model.quant.blocks import BLOCK_TYPES
from kvstrata.model.quant.gguf_rows import NATIVE_TYPES, GgufRows

from quant_support import random_raw


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


def mapped_kb(path: Path) -> int:
    """This process's resident kB of its maps of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            inside = line.endswith(str(path))
        elif inside and head[0] == "Rss:":
            total += int(head[1])
    return total


def test_rows_are_read_from_the_file_not_the_map(tmp_path: Path) -> None:
    """Rows come with pread (a map fault would map the 64 KiB around each row into RSS), with the values
    the map holds, repeats and order kept; ids outside fail."""
    rows, columns = 3000, 64
    raw = np.random.default_rng(0).integers(0, 256, (rows, columns // 32 * 34), dtype=np.uint8)
    raw.reshape(rows, -1, 34)[:, :, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)  # finite scales
    path = tmp_path / "m.bin"
    path.write_bytes(b"\x07" * 96 + raw.tobytes())
    reader = GgufRows(path, 96, raw.nbytes, "Q8_0", (rows, columns))
    whole = reader.chunk(0, rows)  # through the map (as the int8 head is built), then let go
    reader.drop_pages()
    assert mapped_kb(path) == 0
    ids = torch.tensor(np.random.default_rng(1).integers(0, rows, 500))
    ids[5] = ids[6] = rows - 1
    got = reader(ids)
    assert got.abs().max() > 0 and torch.equal(got, whole[ids])
    assert mapped_kb(path) == 0
    assert reader(torch.tensor([], dtype=torch.int64)).shape == (0, columns)
    with pytest.raises(IndexError):
        reader(torch.cat([ids, torch.tensor([rows])]))


def test_a_file_replaced_at_its_path_is_not_read(tmp_path: Path) -> None:
    """Rows keep the file they were made on, as its map does: a GGUF downloaded again over the same path while
    a server runs does not feed it another model's rows."""
    rows, columns = 8, 64
    raw = np.random.default_rng(2).integers(0, 256, (rows, columns // 32 * 34), dtype=np.uint8)
    raw.reshape(rows, -1, 34)[:, :, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    path, other = tmp_path / "m.gguf", tmp_path / "new.gguf"
    path.write_bytes(raw.tobytes())
    reader = GgufRows(path, 0, raw.nbytes, "Q8_0", (rows, columns))
    before = reader(torch.arange(rows))
    other.write_bytes((raw ^ 0x55).tobytes())
    other.replace(path)
    assert torch.equal(reader(torch.arange(rows)), before)


def random_rows(type_name: str, rows: int, columns: int, seed: int) -> np.ndarray:
    """[rows, bytes a row] of a random matrix of `type_name` (finite values)."""
    if type_name in BLOCK_TYPES:
        return random_raw(type_name, rows, columns, seed=seed)
    values = np.random.default_rng(seed).standard_normal((rows, columns)).astype(np.float32)
    if type_name == "BF16":
        return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
    return values.astype(np.float16 if type_name == "F16" else np.float32).view(np.uint8).reshape(rows, -1)


@pytest.mark.parametrize("type_name", sorted(NATIVE_TYPES))
def test_the_op_reads_the_values_the_gguf_package_dequantizes(tmp_path: Path, type_name: str) -> None:
    """csrc/gguf_rows.cpp, bit for bit against the package, rows in any order and repeated, in any shape of
    ids; ids outside fail as on the package's path; a type it does not decode stays on that path."""
    assert cpu_kernels.load_kernels()
    rows, columns = 300, 512
    raw = random_rows(type_name, rows, columns, seed=len(type_name))
    path = tmp_path / "m.gguf"
    path.write_bytes(b"\x05" * 32 + raw.tobytes())
    reader = GgufRows(path, 32, raw.nbytes, type_name, (rows, columns))
    reader.native = True
    want = torch.from_numpy(dequantize(raw, GGMLQuantizationType[type_name]).reshape(rows, columns).astype(np.float32))
    ids = torch.tensor(np.random.default_rng(4).integers(0, rows, 200))
    ids[3] = ids[9] = rows - 1
    got = reader(ids)
    assert got.dtype == torch.float32 and got.abs().max() > 0
    assert torch.equal(got.view(torch.int32), want[ids].view(torch.int32))  # the same bits
    whole = reader.chunk(0, rows)  # a quantized head's build reads its rows by the op too
    assert torch.equal(whole.view(torch.int32), want.view(torch.int32)) and torch.equal(reader.chunk(7, 7), want[:0])
    grid = reader(ids[:12].view(3, 4), torch.bfloat16)  # [3, 4] ids: [3, 4, columns], cast once
    assert grid.shape == (3, 4, columns) and torch.equal(grid, want[ids[:12]].view(3, 4, columns).bfloat16())
    assert reader(torch.tensor([], dtype=torch.int64)).shape == (0, columns)
    with pytest.raises(IndexError):
        reader(torch.tensor([0, rows]))
    with pytest.raises(IndexError):
        reader(torch.tensor([-1]))


def test_types_the_op_does_not_decode_stay_on_the_package(tmp_path: Path) -> None:
    assert "Q2_K" not in NATIVE_TYPES
    rows, columns = 4, 256
    raw = np.zeros((rows, GGML_QUANT_SIZES[GGMLQuantizationType.Q2_K][1]), dtype=np.uint8)
    path = tmp_path / "m.gguf"
    path.write_bytes(raw.tobytes())
    reader = GgufRows(path, 0, raw.nbytes, "Q2_K", (rows, columns))
    reader.native = True
    assert reader(torch.tensor([1, 3])).shape == (2, columns)
