"""Fast reader of a GGUF file's header: metadata, tensor table and a stable identity.

`gguf.GGUFReader` builds numpy views for every element of every metadata array, which takes
about 2 s for a 49k-token vocabulary. Startup paths that only need a few keys (the cached
tokenizer, the weights identity) read the header here instead, in a few tens of milliseconds,
skipping the big arrays unless asked for them.

Layout (little-endian, GGUF v2/v3):
    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv    x  (string key, u32 value_type, value)
    n_tensors x (string name, u32 n_dims, u64 dims[n_dims] (innermost first), u32 ggml_type, u64 offset)
    padding to `general.alignment` (default 32), then tensor data; offsets are relative to it.
"""
from __future__ import annotations

import hashlib
import mmap
import re
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstrata.model.file_digest import file_sha256

_SCALARS = {  # GGUF value type -> struct format
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d",
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class SkippedArray:
    """A metadata array the reader stepped over; only its length is known."""

    length: int

    def __len__(self) -> int:
        return self.length


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order (outermost first), i.e. GGUF dims reversed
    ggml_type: int
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: tuple[GGUFTensorInfo, ...]
    data_offset: int
    file_size: int
    header_sha256: str  # of every byte before the tensor data

    def tensor_names(self) -> list[str]:
        return [t.name for t in self.tensors]


def read_gguf_header(path: str | Path, load_arrays: Collection[str] = ()) -> GGUFHeader:
    """Parse the header of `path`; arrays are read in full only for keys in `load_arrays`. A start reads
    it several times (weights plan, tokenizer, loader; ~0.2 s each for a 49k vocabulary, whose strings
    must be stepped over one by one): a parse is kept by the file's size, mtime and inode, and used again
    only while the header's bytes still hash to what it read (a few ms)."""
    path = Path(path)
    st = path.stat()  # FileNotFoundError as open() would raise it
    key = (path.resolve(), st.st_size, st.st_mtime_ns, st.st_ino, tuple(sorted(load_arrays)))
    kept = _kept.get(key)
    if kept is not None and _header_sha(path, kept.data_offset) == kept.header_sha256:  # the key has the size
        return kept
    header = _read(key[0], load_arrays)
    _kept[key] = header
    while len(_kept) > KEPT_HEADERS:
        _kept.pop(next(iter(_kept)))
    return header


KEPT_HEADERS = 8
_kept: dict[tuple[Any, ...], GGUFHeader] = {}


def _header_sha(path: Path, data_offset: int) -> str:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return hashlib.sha256(buf[:data_offset]).hexdigest()


def _read(path: Path, load_arrays: Collection[str]) -> GGUFHeader:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (bad magic); pass a .gguf file or a HF folder.")
        cursor = _Cursor(buf, 4)
        version = cursor.scalar("<I")
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} is not supported (need 2 or 3, little-endian).")
        n_tensors, n_kv = cursor.scalar("<Q"), cursor.scalar("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cursor.string()
            metadata[key] = cursor.value(cursor.scalar("<I"), keep=key in load_arrays)
        raw_tensors = []
        for _ in range(n_tensors):
            name = cursor.string()
            dims = [cursor.scalar("<Q") for _ in range(cursor.scalar("<I"))]
            raw_tensors.append((name, dims, cursor.scalar("<I"), cursor.scalar("<Q")))
        alignment = int(metadata.get("general.alignment", 32))
        data_offset = -(-cursor.pos // alignment) * alignment
        header_sha = hashlib.sha256(buf[:data_offset]).hexdigest()
        file_size = len(buf)
    tensors = []
    for name, dims, ggml_type, rel in raw_tensors:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        count = 1
        for d in dims:
            count *= d
        tensors.append(GGUFTensorInfo(
            name=name,
            shape=tuple(reversed(dims)),
            ggml_type=ggml_type,
            offset=data_offset + rel,
            nbytes=count // block * type_size,
        ))
    return GGUFHeader(path, version, metadata, tuple(tensors), data_offset, file_size, header_sha)


def gguf_identity(header: GGUFHeader) -> str:
    """Short stable id: file stem, size, and the SHA-256 of every byte of the file.

    The KV namespace is built on it, and L3 pages are shared across servers: two files that differ
    anywhere must differ here (a hash of 16 sampled chunks did not see the bytes between them). The
    whole-file hash is computed once per (path, size, mtime) and kept (file_digest.py).
    """
    return f"{safe_stem(header.path.name)}-{header.file_size}-{file_sha256(header.path)[:16]}"


def safe_stem(name: str) -> str:
    """A file-name-safe short form of `name` (extension dropped)."""
    stem = name.rsplit(".", 1)[0] if "." in name else name
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem)[:64] or "model"


class _Cursor:
    """Sequential little-endian reads over the mapped header."""

    def __init__(self, buf: mmap.mmap, pos: int) -> None:
        self.buf = buf
        self.pos = pos

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.scalar("<Q")
        raw = self.buf[self.pos:self.pos + length]
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, keep: bool = True) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise ValueError(f"corrupt GGUF header: unknown value type {vtype} at byte {self.pos}")
        item_type, count = self.scalar("<I"), self.scalar("<Q")
        if item_type in _SCALARS:
            size = struct.calcsize(_SCALARS[item_type])
            if not keep:
                self.pos += size * count
                return SkippedArray(count)
            fmt = "<" + _SCALARS[item_type][1] * count
            values = list(struct.unpack_from(fmt, self.buf, self.pos))
            self.pos += size * count
            return values
        if item_type == _STRING and not keep:
            for _ in range(count):
                length = self.scalar("<Q")  # read before moving: `pos += scalar()` would use the old pos
                self.pos += length
            return SkippedArray(count)
        return [self.value(item_type) for _ in range(count)]
