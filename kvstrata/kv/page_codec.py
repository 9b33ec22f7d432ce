"""PageCodec: one KV page as a self-describing L3 value.

    value = header | payload | crc32(header | payload)   (all integers little-endian)

    header: magic b"KVSTPAGE", version u16, namespace 32 B (hashing.namespace_root), key 32 B (the
            page's chain hash), page_size u32, layers u32, kv_heads u32, head_dim u32,
            dtype 16 B (ASCII, NUL-padded), payload_len u64
    payload: the page's K/V, [2, layers, page_size, kv_heads, head_dim] of dtype (`page_io` layout)

A value is accepted only if every header field equals this engine's and the checksum holds, so a
value written by another model, dtype, page size or layout ("foreign"), cut short ("truncated") or
with a flipped bit ("corrupt") is a miss, never wrong tokens. The key inside the value also guards
against a store that hands back the value of another key.
"""
from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

MAGIC = b"KVSTPAGE"
VERSION = 1
_HEADER = struct.Struct("<8sH32s32sIIII16sQ")
_CRC = struct.Struct("<I")
HEADER_BYTES = _HEADER.size


class Decoded(NamedTuple):
    payload: memoryview | None  # the page bytes, or None on a miss
    miss: str | None  # None | "truncated" | "corrupt" | "foreign"


class PageCodec:
    def __init__(
        self, namespace: bytes, page_size: int, layers: int, kv_heads: int, head_dim: int, dtype: str,
        page_bytes: int,
    ) -> None:
        if len(namespace) != 32:
            raise ValueError(f"namespace must be 32 bytes (a namespace_root), got {len(namespace)}")
        self.namespace = namespace
        self.page_bytes = page_bytes
        self.shape = (2, layers, page_size, kv_heads, head_dim)
        self._fields = (page_size, layers, kv_heads, head_dim, dtype.encode()[:16].ljust(16, b"\0"))
        self.value_bytes = HEADER_BYTES + page_bytes + _CRC.size

    def encode(self, key: bytes, payload: bytes | memoryview) -> bytes:
        """The stored value for page `key` (its 32-byte chain hash) holding `payload`."""
        if len(payload) != self.page_bytes:
            raise ValueError(f"payload has {len(payload)} bytes, a page has {self.page_bytes}")
        header = _HEADER.pack(MAGIC, VERSION, self.namespace, key, *self._fields, len(payload))
        crc = zlib.crc32(payload, zlib.crc32(header))
        return b"".join((header, payload, _CRC.pack(crc)))

    def decode(self, key: bytes, value: bytes | memoryview | None) -> Decoded:
        """The payload of `value` if it is this engine's page `key`; else the kind of miss."""
        if value is None:
            return Decoded(None, None)
        view = memoryview(value)
        if len(view) < HEADER_BYTES + _CRC.size:
            return Decoded(None, "truncated")
        magic, version, namespace, vkey, *fields, payload_len = _HEADER.unpack_from(view)
        if magic != MAGIC:
            return Decoded(None, "corrupt")
        if version != VERSION or namespace != self.namespace or tuple(fields) != self._fields:
            return Decoded(None, "foreign")
        if payload_len != self.page_bytes:
            return Decoded(None, "corrupt")
        if len(view) != self.value_bytes:
            return Decoded(None, "truncated" if len(view) < self.value_bytes else "corrupt")
        end = HEADER_BYTES + payload_len
        (crc,) = _CRC.unpack_from(view, end)
        if zlib.crc32(view[:end]) != crc:
            return Decoded(None, "corrupt")
        if vkey != key:
            return Decoded(None, "foreign")
        return Decoded(view[HEADER_BYTES:end], None)
