"""The page hash chain: one content address per full page of a prompt.

    h_{-1} = namespace_root(model, dtype, page_size, layout)    (or a `parent` hash, to continue)
    h_i    = sha256(h_{i-1} || token bytes of page i || extra_key bytes)

Token bytes are the page's token ids as little-endian uint32 (4 bytes each), so a page is always
`4 * page_size` bytes and the trailing `extra_key` (a tenant `cache_salt`, UTF-8) is unambiguous.
`extra_key=None` and `extra_key=""` hash the same: both mean "no salt".

Because every hash folds in its parent, h_i names the whole prefix up to page i, and because the
root folds in the model identity, dtype, page size and KV layout, an L2/L3 entry written by another
model or layout can never be found. Only FULL pages are hashed; a partial last page has no hash.
"""
from __future__ import annotations

import hashlib
import sys
from array import array
from typing import Sequence

TOKEN_BYTES = 4

# The array typecode whose items are 4-byte unsigned ints on this platform ("I" almost everywhere).
_U32 = next(code for code in "IL" if array(code).itemsize == TOKEN_BYTES)
_SWAP = sys.byteorder == "big"


def token_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32 bytes (`4 * len(tokens)` bytes).

    Accepts lists, tuples, ranges, and anything with `.tolist()` (numpy arrays, torch tensors).
    Uses `array` rather than numpy: from a Python list it is ~3x faster (~25 us for 4k tokens).
    """
    if hasattr(tokens, "tolist"):
        tokens = tokens.tolist()  # type: ignore[union-attr]
    try:
        packed = array(_U32, tokens)
    except OverflowError as e:
        raise ValueError(f"token ids must be in [0, 2**32): {e}") from None
    except TypeError as e:
        raise ValueError(f"token ids must be ints: {e}") from None
    if _SWAP:
        packed.byteswap()
    return packed.tobytes()


def tokens_from_bytes(data: bytes) -> list[int]:
    """Inverse of `token_bytes`."""
    packed = array(_U32, data)
    if _SWAP:
        packed.byteswap()
    return packed.tolist()


def namespace_root(model_identity: str, dtype: str, page_size: int, layout: str) -> bytes:
    """h_{-1}: a 32-byte root unique to (model, KV dtype, page size, KV layout)."""
    fields = ("kvstrata-page-hash-v1", model_identity, dtype, str(page_size), layout)
    # Length-prefixed fields, so ("ab", "c") and ("a", "bc") cannot collide.
    payload = b"".join(len(f.encode()).to_bytes(4, "little") + f.encode() for f in fields)
    return hashlib.sha256(payload).digest()


def salt_bytes(extra_key: str | None) -> bytes:
    return extra_key.encode() if extra_key else b""


def chain_hash(parent: bytes, page_token_bytes: bytes, salt: bytes) -> bytes:
    """One link of the chain; `page_token_bytes` is one page from `token_bytes`."""
    return hashlib.sha256(parent + page_token_bytes + salt).digest()


def hash_pages_bytes(data: bytes, page_size: int, parent: bytes, salt: bytes = b"") -> list[bytes]:
    """`hash_pages` over tokens already packed by `token_bytes` (callers that have the bytes)."""
    step = page_size * TOKEN_BYTES
    end = len(data) - len(data) % step
    sha = hashlib.sha256
    h = parent
    out: list[bytes] = []
    for off in range(0, end, step):
        h = sha(h + data[off : off + step] + salt).digest()
        out.append(h)
    return out


def hash_pages(
    tokens: Sequence[int],
    page_size: int,
    root: bytes,
    extra_key: str | None = None,
    parent: bytes | None = None,
) -> list[bytes]:
    """Hashes of every FULL page of `tokens` (`len(tokens) // page_size` of them).

    With `parent`, the chain continues from that hash instead of `root`: `tokens` must then start
    at the page boundary right after the page `parent` names. So
    `hash_pages(t, ps, root)[k:] == hash_pages(t[k*ps:], ps, root, parent=hash_pages(t, ps, root)[k-1])`.
    Cost: ~0.15 ms for a 4k-token prompt with page_size 16.
    """
    if page_size <= 0:
        raise ValueError(f"page_size must be positive, got {page_size}")
    full = len(tokens) - len(tokens) % page_size
    data = token_bytes(tokens[:full] if full != len(tokens) else tokens)
    return hash_pages_bytes(data, page_size, root if parent is None else parent, salt_bytes(extra_key))


def hash_to_int64(h: bytes) -> int:
    """The first 8 bytes of a page hash as a signed big-endian int64 (the KV-event block hash)."""
    return int.from_bytes(h[:8], "big", signed=True)
