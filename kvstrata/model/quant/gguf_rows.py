"""Rows of a GGUF matrix read from the mapped file when asked for: the embedding's rows for a step's
tokens, and the LM head's rows of each step's top candidates (their logits recomputed exactly, head.py).

A model that keeps no dense embedding holds nothing of it but the file mapping, as llama.cpp does: the
operating system pages in the rows that are read (a step's few tokens) and can drop them again; a
prompt's many rows are read from the file instead (`GgufRows.read`), so they never enter RSS.
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import torch

from kvstrata.model.quant.converted_cache import ConvertedCache

READ_MIN_ROWS = 64  # a step's embedding of more tokens than this (a prompt) is read from the file (`read`);
# fewer (decode rows), and the head's candidate rows, through the map, whose pages stay mapped for later steps


class GgufRows:
    def __init__(self, path: Path, offset: int, nbytes: int, type_name: str, shape: tuple[int, int]) -> None:
        self.shape = shape  # [rows, columns], torch order
        self.type_name = type_name
        self.cache: ConvertedCache | None = None  # where what is built from these rows is kept (the int8 head)
        # a map of this tensor's bytes only: [rows, bytes a row]
        self._raw = np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(shape[0], nbytes // shape[0]))
        self._path, self._offset = path, offset

    def __call__(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[n, columns] in `dtype` for the rows `ids` [n] (any integer tensor), through the map."""
        raw = self._raw[ids.to(torch.int64).numpy()]  # copies those rows only
        return self.decode(raw, dtype)

    def read(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """As calling it, but read from the file with pread, not through the map: the kernel maps the
        64 KiB around each row a map fault reads, so a 2k-token prompt of distinct tokens left 54 MiB of
        a 1B model's embedding in RSS; read, the rows stay in the page cache only."""
        at = ids.to(torch.int64).numpy()
        return self.decode(self._read(at) if at.size else self._raw[at], dtype)

    def _read(self, at: np.ndarray) -> np.ndarray:
        if not (0 <= at.min() and at.max() < self.shape[0]):
            raise IndexError(f"row ids outside [0, {self.shape[0]})")
        rows, inverse = np.unique(at, return_inverse=True)
        width = self._raw.shape[1]
        out = np.empty((len(rows), width), dtype=np.uint8)
        fd = os.open(self._path, os.O_RDONLY)
        try:
            for i, r in enumerate(rows.tolist()):
                if os.preadv(fd, [out[i]], self._offset + r * width) != width:
                    raise OSError(f"{self._path}: short read of row {r}")
        finally:
            os.close(fd)
        return out[inverse.reshape(at.shape)]

    def chunk(self, start: int, stop: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
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
