"""Rows of a GGUF matrix read from the mapped file when asked for: the embedding's rows for a step's
tokens, and the LM head's rows of each step's top candidates (their logits recomputed exactly, head.py).

A model that keeps no dense embedding holds nothing of it but the file mapping, as llama.cpp does: the
operating system pages in the rows that are read (a step's few tokens) and can drop them again.
"""
from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import torch

from kvstrata.model.quant.converted_cache import ConvertedCache


class GgufRows:
    def __init__(self, path: Path, offset: int, nbytes: int, type_name: str, shape: tuple[int, int]) -> None:
        self.shape = shape  # [rows, columns], torch order
        self.type_name = type_name
        self.cache: ConvertedCache | None = None  # where what is built from these rows is kept (the int8 head)
        # a map of this tensor's bytes only: [rows, bytes a row]
        self._raw = np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(shape[0], nbytes // shape[0]))

    def __call__(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[n, columns] in `dtype` for the rows `ids` [n] (any integer tensor)."""
        raw = self._raw[ids.to(torch.int64).numpy()]  # copies those rows only
        return self.decode(raw, dtype)

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
