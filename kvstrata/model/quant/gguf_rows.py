"""Rows of a GGUF matrix read from the file when asked for: the embedding's rows for a step's tokens,
and the LM head's rows of each step's top candidates (their logits recomputed exactly, int8_head.py).

A model that keeps no dense embedding holds nothing of it but the file, as llama.cpp does. Rows are
read with pread, never through the map: a map fault maps the 64 KiB around its row (fault-around,
which MADV_RANDOM does not stop on Linux 6.18), so a 2k-token prompt of distinct tokens left 54 MiB of a
1B model's embedding in RSS, and the head's 32 candidates a logit row (256 for an 8-row step) mapped
52 MiB of it during the start-up warm-up alone, growing toward the whole tensor (79 MiB, Q6_K) as
steps went on. Read, the rows stay in the page cache only. Without the op (below) the map serves `chunk`
(building the quantized head once), after which `drop_pages` lets its pages go.

With `native` set (the model sets it where our C++ ops are built), a step's rows are read and dequantized in
one op (csrc/gguf_rows.cpp, the same bits as the `gguf` package's dequantize, which took ~5% of a 1B
model's batch-1 decode step for its embedding row and 32 head candidates).
"""
from __future__ import annotations

import mmap
import os
import weakref
from pathlib import Path

import numpy as np
import torch

from kvstrata.model.quant.converted_cache import ConvertedCache

# the types csrc/gguf_rows.cpp decodes (others go through the `gguf` package)
NATIVE_TYPES = frozenset({"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})


class GgufRows:
    def __init__(self, path: Path, offset: int, nbytes: int, type_name: str, shape: tuple[int, int]) -> None:
        self.shape = shape  # [rows, columns], torch order
        self.type_name = type_name
        self.cache: ConvertedCache | None = None  # where what is built from these rows is kept (the quantized head)
        self.native = False  # rows by csrc/gguf_rows.cpp (set where the op is built; for NATIVE_TYPES only)
        self._ggml_type = self._type_id(type_name) if type_name in NATIVE_TYPES else -1
        # a map of this tensor's bytes only: [rows, bytes a row]
        self._raw = np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(shape[0], nbytes // shape[0]))
        self._path, self._offset = path, offset
        # opened once, as the map is: a file replaced at `path` while serving is not read (rows keep the inode)
        self._fd = os.open(path, os.O_RDONLY)
        weakref.finalize(self, os.close, self._fd)

    def __call__(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[n, columns] in `dtype` for the rows `ids` [n] (any integer tensor), read from the file; on the
        package's path a row asked for several times (the head's candidates of a step's rows overlap) is read
        and decoded once (the op decodes a row in microseconds: it reads repeats again)."""
        if self._by_op:
            flat = ids.to(torch.int64).reshape(-1)
            out = torch.ops.kvstrata.gguf_rows(self._fd, self._offset, self._raw.shape[1], flat, self._ggml_type,
                                               self.shape[1], self.shape[0])
            return out.view(*ids.shape, self.shape[1]).to(dtype)
        at = ids.to(torch.int64).numpy()
        if not at.size:
            return self.decode(self._raw[at], dtype)
        rows, inverse = np.unique(at, return_inverse=True)
        return self.decode(self._read(rows), dtype)[torch.from_numpy(inverse.reshape(at.shape))]

    @property
    def _by_op(self) -> bool:
        """Whether rows are read and decoded by csrc/gguf_rows.cpp (the op is built and decodes this type)."""
        return self.native and self._ggml_type >= 0

    def _read(self, rows: np.ndarray) -> np.ndarray:
        """The raw bytes of `rows` (sorted, distinct) [n, bytes a row], one pread each."""
        if not (0 <= rows[0] and rows[-1] < self.shape[0]):
            raise IndexError(f"row ids outside [0, {self.shape[0]})")
        width = self._raw.shape[1]
        out = np.empty((len(rows), width), dtype=np.uint8)
        for i, r in enumerate(rows.tolist()):
            if os.preadv(self._fd, [out[i]], self._offset + r * width) != width:
                raise OSError(f"{self._path}: short read of row {r}")
        return out

    @staticmethod
    def _type_id(type_name: str) -> int:
        from gguf import GGMLQuantizationType

        return int(GGMLQuantizationType[type_name].value)

    def chunk(self, start: int, stop: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Rows start..stop (building a quantized head from them): by the op where it decodes this type (a
        1B Q4_K_M's 49,152 Q6_K head rows 0.9 s through the package at a first start), else through the map."""
        if self._by_op:
            return self(torch.arange(start, stop), dtype)
        return self.decode(self._raw[start:stop], dtype)

    def drop_pages(self) -> None:
        """Let the pages read so far leave this process's memory (they stay in the page cache)."""
        drop_pages(self._raw, 0, self._raw.size)

    def decode(self, raw: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        """Rows of raw bytes -> values, as the `gguf` package dequantizes them (the dense path's values)."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        shape = (raw.shape[0], self.shape[1])
        if raw.shape[0] == 0:  # a step with no rows to read (gguf's dequantize cannot take none)
            return torch.empty(shape, dtype=dtype)
        values = dequantize(raw, GGMLQuantizationType[self.type_name])
        return torch.from_numpy(np.array(values, dtype=np.float32, copy=True).reshape(shape)).to(dtype)


def drop_pages(data: np.memmap, offset: int, nbytes: int) -> None:
    """madvise(MADV_DONTNEED) over the pages of data[offset:offset + nbytes]: a read-only file map's
    pages leave the process's RSS and come back from the page cache if read again."""
    mm = getattr(data, "_mmap", None)
    if mm is None or not hasattr(mmap, "MADV_DONTNEED"):
        return
    base = data.offset if hasattr(data, "offset") else 0  # the map starts at the file offset rounded down
    start = (base % mmap.ALLOCATIONGRANULARITY) + offset
    first = start - start % mmap.PAGESIZE
    length = min(len(mm), start + nbytes) - first
    if length > 0:
        mm.madvise(mmap.MADV_DONTNEED, first, length)
