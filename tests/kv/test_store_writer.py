"""StoreWriter: what it remembers the store holds, and when it forgets (a failure, a probe that
found pages gone), so a store that lost pages gets them again; the queue stays bounded."""
from __future__ import annotations

import threading

import torch

from kvstrata.kv.hashing import namespace_root
from kvstrata.kv.page_codec import PageCodec
from kvstrata.kv.page_io import page_shape
from kvstrata.kv.pool import PagePool
from kvstrata.kv.store.guard import GuardedStore
from kvstrata.kv.store_writer import StoreWriter
from kvstrata.kv.tier_stats import TierStats

PS = 4


class DictStore:
    """An in-memory KVStore that records puts, can fail, and can block puts until released."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.puts: list[list[str]] = []
        self.fail = False
        self.gate = threading.Event()
        self.gate.set()

    def batch_exists(self, keys: list[str]) -> int:
        if self.fail:
            raise ConnectionError("store is down")
        n = 0
        while n < len(keys) and keys[n] in self.data:
            n += 1
        return n

    def batch_get(self, keys: list[str]) -> list[bytes | None]:
        return [self.data.get(k) for k in keys]

    def batch_put(self, keys: list[str], values: list[bytes]) -> None:
        if self.fail:
            raise ConnectionError("store is down")
        self.gate.wait()
        self.puts.append(list(keys))
        self.data.update(zip(keys, values))

    def close(self) -> None:
        pass


def setup(max_pending_pages: int = 1000) -> tuple[StoreWriter, DictStore, PagePool]:
    pool = PagePool(8, PS, layers=2, kv_heads=2, head_dim=4, dtype=torch.float32)
    for t in pool.k + pool.v:
        t.copy_(torch.randn(t.shape))
    shape = page_shape(pool)
    page_bytes = int(torch.tensor(shape).prod()) * 4
    codec = PageCodec(namespace_root("m", "float32", PS, "test"), PS, 2, 2, 4, "float32", page_bytes)
    store = DictStore()
    guard = GuardedStore(store, "dict", TierStats(), backoff_s=0.0)  # type: ignore[arg-type]
    return StoreWriter(guard, codec, max_pending_bytes=max_pending_pages * page_bytes), store, pool


def h(i: int) -> bytes:
    return i.to_bytes(32, "big")


def test_known_pages_are_not_sent_twice_until_the_store_fails() -> None:
    writer, store, pool = setup()
    writer.submit(pool, [h(1), h(2)], [0, 1])
    assert writer.drain(5.0) and store.puts == [[h(1).hex(), h(2).hex()]]
    writer.submit(pool, [h(1), h(2), h(3)], [0, 1, 2])
    assert writer.drain(5.0) and store.puts[1:] == [[h(3).hex()]]  # only the new page
    store.data.clear()  # a restart without persistence: everything is gone...
    store.fail = True  # ...and the writer saw the server fail
    writer.submit(pool, [h(4)], [3])
    assert writer.drain(5.0) and not writer.is_known(h(4)) and h(4).hex() not in store.data
    store.fail = False
    writer.submit(pool, [h(1), h(2), h(3), h(4)], [0, 1, 2, 3])
    assert writer.drain(5.0)
    assert sorted(store.data) == sorted(x.hex() for x in (h(1), h(2), h(3), h(4)))  # all written again


def test_forgotten_pages_are_written_again() -> None:
    writer, store, pool = setup()
    writer.submit(pool, [h(1), h(2)], [0, 1])
    assert writer.drain(5.0)
    del store.data[h(2).hex()]  # expired or evicted, silently
    writer.submit(pool, [h(1), h(2)], [0, 1])
    assert writer.drain(5.0) and h(2).hex() not in store.data  # still believed to be there
    writer.forget([h(2)])  # a prefetch probe found it missing
    writer.submit(pool, [h(1), h(2)], [0, 1])
    assert writer.drain(5.0) and h(2).hex() in store.data


def test_the_queue_is_bounded_new_pages_dropped_and_counted_flush_waits() -> None:
    writer, store, pool = setup(max_pending_pages=2)
    store.gate.clear()  # the store takes writes but does not finish them
    writer.submit(pool, [h(1), h(2)], [0, 1])
    writer.submit(pool, [h(3)], [2])  # no room: dropped, counted, not known
    assert writer.pending_bytes == 2 * writer.codec.page_bytes
    assert writer.store.stats.snapshot().errors == {("dict", "write_dropped"): 1}
    assert not writer.is_known(h(3))
    snapshot = torch.zeros(1, writer.codec.page_bytes, dtype=torch.uint8)
    assert writer.submit_snapshot([h(5)], snapshot, wait_s=0.1) is None  # waited for room, none came
    threading.Timer(0.2, store.gate.set).start()
    future = writer.submit_snapshot([h(5)], snapshot, wait_s=5.0)  # room comes once the store answers
    assert future is not None and future.result(5.0) == 1
    assert writer.drain(5.0) and h(5).hex() in store.data and h(3).hex() not in store.data
    writer.close()
