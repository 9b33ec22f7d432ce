"""The KVStore contract, one test body for every backend (file, redis, mooncake), plus each
backend's own promises (file: atomic writes and the LRU size cap)."""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from kvstrata.kv.store import KVStore, create_store
from kvstrata.kv.store.file_store import FileStore


def keys(n: int) -> list[str]:
    run = uuid.uuid4().hex  # servers are shared by the session: every test writes fresh keys
    return [f"{run}{i:04x}" for i in range(n)]


def test_contract(store: KVStore) -> None:
    k = keys(5)
    values = [os.urandom(1000 + i) for i in range(4)] + [os.urandom(400_000)]  # one page-sized value
    assert store.batch_exists([]) == 0 and store.batch_get([]) == []
    assert store.batch_exists(k) == 0
    assert store.batch_get(k[:2]) == [None, None]

    store.batch_put(k[:3], values[:3])
    assert store.batch_exists(k) == 3  # the leading run present
    assert store.batch_exists([k[0], k[4], k[1]]) == 1
    assert store.batch_exists([k[4], k[0]]) == 0
    assert store.batch_get([k[2], k[4], k[0]]) == [values[2], None, values[0]]

    store.batch_put(k[:5], values)  # keys are content addresses: putting one again is no error
    assert store.batch_exists(k) == 5
    assert store.batch_get(k) == values


def test_registry_names_backends_and_refuses_unknown_options(tmp_path: Path) -> None:
    assert isinstance(create_store("file", {"path": str(tmp_path)}), FileStore)
    with pytest.raises(ValueError, match="choose one of"):
        create_store("s3", {})
    with pytest.raises(ValueError, match="does not take"):
        create_store("file", {"path": str(tmp_path), "url": "redis://x"})


def test_file_writes_are_atomic_and_leave_no_temp_files(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    k = keys(3)
    store.batch_put(k, [b"a" * 10, b"b" * 10, b"c" * 10])
    files = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert files == sorted(k)
    # a second process sees the same values
    assert FileStore(tmp_path).batch_get(k) == [b"a" * 10, b"b" * 10, b"c" * 10]


def test_file_size_cap_drops_least_recently_used(tmp_path: Path) -> None:
    store = FileStore(tmp_path, max_size_gb=4500 / 1e9)  # room for four 1000-byte values
    k = keys(6)
    for i in range(4):
        store.batch_put([k[i]], [bytes([i]) * 1000])
        time.sleep(0.01)  # distinct mtimes
    assert store.batch_get([k[0]]) == [bytes([0]) * 1000]  # k0 read: now the most recent
    time.sleep(0.01)
    store.batch_put([k[4]], [b"x" * 1000])  # 5000 > cap: drop the least recently used down to 4050
    present = [key for key in k[:5] if store.batch_exists([key])]
    assert present == [k[0], k[2], k[3], k[4]]  # k1 went: the oldest once k0 was read
    assert sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()) == 4000
