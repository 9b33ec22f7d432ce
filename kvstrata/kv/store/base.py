"""KVStore: the L3 protocol every backend implements (`file`, `redis`, `mooncake`).

Keys are page hash chains in hex (`hashing.py`: already namespaced by model, dtype, page size and
layout); values are opaque bytes (`page_codec.py` makes them self-describing). A backend may raise
on any call when it is down: `GuardedStore` turns that into a miss, a counter and a warning, so a
backend stays a thin, honest adapter over its client.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable


class StoreUnavailableError(RuntimeError):
    """The backend cannot be reached or set up; the message says what to check."""


class StoreTimeoutError(StoreUnavailableError):
    """A backend call did not return within the store call timeout (it was abandoned)."""


@runtime_checkable
class KVStore(Protocol):
    def batch_exists(self, keys: list[str]) -> int:
        """How many of `keys`, from the first, the store holds (the leading run)."""
        ...

    def batch_get(self, keys: list[str]) -> list[bytes | None]:
        """The value of each key, None where it is missing."""
        ...

    def batch_put(self, keys: list[str], values: list[bytes], ttl_s: float | None = None) -> None:
        """Store every pair (overwriting is allowed, never required). `ttl_s`: the values' lifetime
        (prompt_cache_retention "24h") where the backend has one; None = the backend's default."""
        ...

    def close(self) -> None:
        ...


def leading_run(flags: list[bool] | list[int]) -> int:
    """How many leading entries are truthy (== 1 for Mooncake's 1/0/-1 answers)."""
    n = 0
    for f in flags:
        if f != 1:
            break
        n += 1
    return n
