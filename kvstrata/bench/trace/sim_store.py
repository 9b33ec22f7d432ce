"""The simulator's L3 and its capacity specs.

`LruCapStore` is a KVStore (kvstrata/kv/store/base.py) in memory that evicts the way the file
store does (kvstrata/kv/store/file_store.py): every write and every read (`batch_get`, which
bumps a file's mtime there) makes a value the most recent; `batch_exists` does not; once more than
`cap_pages` values are held, the least recently used go until 90% of the cap is left. The file
store counts bytes; every simulated page has the same size, so pages are the same measure.

`parse_capacities("8k,8k:32k,8k:32k:inf")` reads `--capacities`: each item is L1[:L2[:L3]] in
tokens (suffix k or M; `inf` = unbounded); a missing L2 or L3 is 0 (no such tier).
"""
from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from typing import NamedTuple

UNBOUNDED = math.inf
_NUMBER = re.compile(r"^(\d+(?:\.\d+)?)([kKmM]?)$")


class Capacity(NamedTuple):
    l1: float  # tokens; UNBOUNDED = every page of the trace
    l2: float = 0  # 0 = no L2
    l3: float = 0  # 0 = no L3 (an L3 needs an L2, as in `kvstrata serve`)

    def label(self) -> str:
        parts = [self.l1, self.l2, self.l3]
        while len(parts) > 1 and parts[-1] == 0:
            parts.pop()
        return ":".join(format_tokens(p) for p in parts)


def format_tokens(n: float) -> str:
    if n == UNBOUNDED:
        return "inf"
    if n >= 1_000_000 and n % 100_000 == 0:
        return f"{n / 1e6:g}M"
    if n >= 1000 and n % 100 == 0:
        return f"{n / 1e3:g}k"
    return f"{int(n)}"


def _tokens(text: str, item: str) -> float:
    text = text.strip()
    if text.lower() in ("inf", "unbounded"):
        return UNBOUNDED
    m = _NUMBER.match(text)
    if not m:
        raise ValueError(f"--capacities item {item!r}: {text!r} is not a token count (like 4096, 8k, 1.5M or inf)")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6}[m.group(2).lower()]
    return float(int(value))


def parse_capacities(spec: str) -> list[Capacity]:
    """`--capacities` -> one Capacity per comma-separated item; ValueError naming a bad item."""
    out = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        fields = item.split(":")
        if len(fields) > 3:
            raise ValueError(f"--capacities item {item!r}: at most three tiers, L1:L2:L3")
        values = [_tokens(f, item) for f in fields] + [0.0] * (3 - len(fields))
        cap = Capacity(*values)
        if cap.l1 <= 0:
            raise ValueError(f"--capacities item {item!r}: L1 must be > 0 tokens")
        if cap.l3 > 0 and cap.l2 <= 0:
            raise ValueError(f"--capacities item {item!r}: an L3 needs an L2 (as `kvstrata serve` does)")
        out.append(cap)
    if not out:
        raise ValueError("--capacities is empty")
    return out


class LruCapStore:
    """An in-memory KVStore with the file store's eviction: LRU, down to 90% once over the cap."""

    def __init__(self, cap_pages: float = UNBOUNDED) -> None:
        if cap_pages <= 0:
            raise ValueError(f"L3 capacity must be > 0 pages, got {cap_pages}")
        self.cap = cap_pages
        self._values: OrderedDict[str, bytes] = OrderedDict()
        self.evicted = 0
        self._lock = threading.Lock()  # the writer and the prefetcher call from their own threads

    def __len__(self) -> int:
        return len(self._values)

    def batch_exists(self, keys: list[str]) -> int:
        with self._lock:
            n = 0
            for key in keys:
                if key not in self._values:
                    break
                n += 1
            return n

    def batch_get(self, keys: list[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        with self._lock:
            for key in keys:
                value = self._values.get(key)
                if value is not None:
                    self._values.move_to_end(key)
                out.append(value)
        return out

    def batch_put(self, keys: list[str], values: list[bytes]) -> None:
        with self._lock:
            for key, value in zip(keys, values, strict=True):
                self._values[key] = value
                self._values.move_to_end(key)
            if len(self._values) > self.cap:
                target = int(self.cap * 0.9)
                while len(self._values) > target:
                    self._values.popitem(last=False)
                    self.evicted += 1

    def close(self) -> None:
        pass
