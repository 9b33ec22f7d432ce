"""Retained pages' lifetime in L3: Redis keeps them with a TTL (SET PX, checked on a real
redis-server), the file store's cleanup takes them last until their lifetime ends."""
from __future__ import annotations

import os
import time
from pathlib import Path

import redis

from kvstrata.kv.store import create_store
from kvstrata.kv.store.file_store import FileStore

DAY_S = 24 * 3600


def keys(n: int) -> list[str]:
    return [f"{i:064x}" for i in range(1, n + 1)]


def test_redis_ttl_for_retained_values_and_default_for_others(redis_url: str) -> None:
    store = create_store("redis", {"url": redis_url, "prefix": "ttl-test:"})
    r = redis.Redis.from_url(redis_url)
    try:
        k = keys(4)
        store.batch_put(k[:2], [b"a", b"b"], ttl_s=DAY_S)
        store.batch_put(k[2:], [b"c", b"d"])
        day_ms = DAY_S * 1000
        assert all(day_ms - 60_000 < r.pttl(f"ttl-test:{key}") <= day_ms for key in k[:2])
        assert [r.pttl(f"ttl-test:{key}") for key in k[2:]] == [-1, -1]  # no ttl_s configured: no expiry
        store.batch_put(k[3:], [b"e"], ttl_s=0.2)  # a short lifetime really expires
        deadline = time.monotonic() + 10
        while store.batch_get(k[3:]) != [None]:
            assert time.monotonic() < deadline, "the value did not expire"
            time.sleep(0.05)
        assert store.batch_get(k[:3]) == [b"a", b"b", b"c"]
    finally:
        r.close()
        store.close()


def test_file_cleanup_takes_retained_values_last_until_they_expire(tmp_path: Path) -> None:
    store = FileStore(tmp_path, max_size_gb=4500 / 1e9)  # room for four 1000-byte values
    k = keys(6)
    store.batch_put([k[0]], [b"r" * 1000], ttl_s=DAY_S)  # the oldest write, but retained
    for i in (1, 2, 3):
        store.batch_put([k[i]], [bytes([i]) * 1000])
    assert store.batch_get([k[0]]) == [b"r" * 1000]  # a read does not pull the expiry back to now
    assert store._file(k[0]).stat().st_mtime > time.time() + DAY_S - 60
    store.batch_put([k[4]], [b"x" * 1000])  # over the cap: an ordinary value goes, not the retained one
    assert store.batch_exists([k[0]]) == 1 and store.batch_exists([k[1]]) == 0
    os.utime(store._file(k[0]), (1.0, 1.0))  # its lifetime ended: now it is the oldest value
    store.batch_put([k[5]], [b"y" * 1000])
    assert store.batch_exists([k[0]]) == 0
