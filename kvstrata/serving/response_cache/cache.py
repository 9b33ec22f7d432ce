"""ResponseCache: an LRU of request keys, each holding a short list of finished results.

EnergonAI's ListCache, keeping its three ideas (LRU of keys, a list of results per key, fixed keys)
and fixing its rules:

| where           | keys                                        | evicted            | counted in size |
|-----------------|---------------------------------------------|--------------------|-----------------|
| `self._lru`     | ordinary keys, least recently used first    | oldest, on add     | yes             |
| `self._fixed`   | the `fixed_keys` given at construction      | never              | no              |

A key's list is full at `capacity` results: 1 for a deterministic request (temperature 0 or a
seed: it has one possible output), `list_size` otherwise. A key is a hit only once its list is
full; then one result is returned at random (seeded by the request's seed when it has one).
Every hit and every add moves the key to the most-recent end.

Invariants (`check_integrity`): len(_lru) <= size; no key in both maps; every entry holds
1..capacity results and capacity is 1 or list_size. Thread-safe: one lock around every call.
The cache is keyed by opaque strings (`key.request_key`) and knows nothing of HTTP.
"""
from __future__ import annotations

import random
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Generic, Iterable, NamedTuple, TypeVar

V = TypeVar("V")


@dataclass
class _Entry(Generic[V]):
    capacity: int
    results: list[V] = field(default_factory=list)

    @property
    def full(self) -> bool:
        return len(self.results) >= self.capacity


class ResponseCacheStats(NamedTuple):
    size: int  # most ordinary keys
    list_size: int  # results per sampled key
    entries: int  # keys holding at least one result (fixed ones included)
    fixed_keys: int  # keys that are never evicted
    evictions: int  # ordinary keys evicted since start


class ResponseCache(Generic[V]):
    def __init__(self, size: int, list_size: int = 1, fixed_keys: Iterable[str] = (), seed: int | None = None) -> None:
        if size < 0:
            raise ValueError(f"response cache size must be >= 0 (0 = off), got {size}")
        if list_size < 1:
            raise ValueError(f"response cache list size must be >= 1 result per key, got {list_size}")
        self.size = size
        self.list_size = list_size
        self.fixed_keys = frozenset(fixed_keys)
        self.evictions = 0
        self._lru: OrderedDict[str, _Entry[V]] = OrderedDict()
        self._fixed: dict[str, _Entry[V]] = {}
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def capacity(self, deterministic: bool) -> int:
        return 1 if deterministic else self.list_size

    def get(self, key: str, seed: int | None = None) -> V | None:
        """A result if the key's list is full (and the key moves to the most-recent end), else None."""
        with self._lock:
            entry = self._entry(key)
            if entry is None or not entry.full:
                return None
            self._touch(key)
            rng = self._rng if seed is None else random.Random(seed)
            return rng.choice(entry.results)

    def needed(self, key: str, deterministic: bool) -> int:
        """How many more results the key needs before it hits (0 = full). Read-only."""
        with self._lock:
            entry = self._entry(key)
            if entry is None:
                return self.capacity(deterministic)
            return max(0, entry.capacity - len(entry.results))

    def add(self, key: str, value: V, deterministic: bool = False) -> list[str]:
        """Append a result to the key's list (a full list stays as it is); returns the keys evicted."""
        with self._lock:
            entry = self._entry(key)
            if entry is None:
                if key not in self.fixed_keys and self.size == 0:
                    return []
                entry = _Entry(self.capacity(deterministic))
                if key in self.fixed_keys:
                    self._fixed[key] = entry
                else:
                    self._lru[key] = entry
            if not entry.full:
                entry.results.append(value)
            self._touch(key)
            evicted: list[str] = []
            while len(self._lru) > self.size:
                old, _ = self._lru.popitem(last=False)
                evicted.append(old)
            self.evictions += len(evicted)
            return evicted

    def flush(self) -> int:
        """Drop every result (fixed keys stay fixed); returns how many keys held results."""
        with self._lock:
            dropped = len(self._lru) + len(self._fixed)
            self._lru.clear()
            self._fixed.clear()
            return dropped

    def __len__(self) -> int:
        return len(self._lru) + len(self._fixed)

    def __contains__(self, key: object) -> bool:
        return key in self._lru or key in self._fixed

    def keys(self) -> list[str]:
        """Ordinary keys from least to most recently used, then the fixed keys holding results."""
        with self._lock:
            return [*self._lru, *self._fixed]

    def stats(self) -> ResponseCacheStats:
        with self._lock:
            entries = len(self._lru) + len(self._fixed)
            return ResponseCacheStats(self.size, self.list_size, entries, len(self.fixed_keys), self.evictions)

    def check_integrity(self) -> None:
        with self._lock:
            assert len(self._lru) <= self.size, (len(self._lru), self.size)
            assert not set(self._lru) & set(self._fixed), "a key is both fixed and ordinary"
            assert set(self._fixed) <= self.fixed_keys, "a fixed entry whose key is not fixed"
            for key, entry in [*self._lru.items(), *self._fixed.items()]:
                assert entry.capacity in (1, self.list_size), (key, entry.capacity)
                assert 1 <= len(entry.results) <= entry.capacity, (key, len(entry.results), entry.capacity)

    # -- under the lock ----------------------------------------------------------------------
    def _entry(self, key: str) -> _Entry[V] | None:
        entry = self._fixed.get(key)
        return entry if entry is not None else self._lru.get(key)

    def _touch(self, key: str) -> None:
        if key in self._lru:
            self._lru.move_to_end(key)
