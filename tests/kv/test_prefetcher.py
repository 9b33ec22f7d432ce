"""Prefetcher: L3 pages come back in prefix order until the first miss, within the deadline, and
a slow, failing or corrupt store costs hits, never an exception."""
from __future__ import annotations

import os
import threading
import time

import pytest

from kvstrata.kv.hashing import namespace_root
from kvstrata.kv.page_codec import PageCodec
from kvstrata.kv.prefetcher import Fetched, Prefetcher, PrefetchPolicy
from kvstrata.kv.store.guard import GuardedStore
from kvstrata.kv.tier_stats import TierStats

PAGE_BYTES = 256
CODEC = PageCodec(namespace_root("m", "float32", 4, "test"), 4, 2, 2, 2, "float32", PAGE_BYTES)
HASHES = [bytes([i]) * 32 for i in range(1, 8)]
PAYLOADS = [os.urandom(PAGE_BYTES) for _ in HASHES]


class DictStore:
    """An in-memory KVStore that counts calls and can be slowed down or broken."""

    def __init__(self, delay_s: float = 0.0, fail: bool = False) -> None:
        self.data: dict[str, bytes] = {}
        self.delay_s = delay_s
        self.fail = fail
        self.gets: list[int] = []
        self.release = threading.Event()

    def batch_exists(self, keys: list[str]) -> int:
        if self.fail:
            raise ConnectionError("store is down")
        n = 0
        while n < len(keys) and keys[n] in self.data:
            n += 1
        return n

    def batch_get(self, keys: list[str]) -> list[bytes | None]:
        self.gets.append(len(keys))
        if self.delay_s:
            self.release.wait(self.delay_s)
        return [self.data.get(k) for k in keys]

    def batch_put(self, keys: list[str], values: list[bytes]) -> None:
        self.data.update(zip(keys, values))

    def close(self) -> None:
        pass


def filled(n: int, **kw: object) -> DictStore:
    store = DictStore(**kw)  # type: ignore[arg-type]
    store.batch_put([h.hex() for h in HASHES[:n]], [CODEC.encode(h, p) for h, p in zip(HASHES[:n], PAYLOADS)])
    return store


def prefetcher(store: DictStore, **policy: object) -> tuple[Prefetcher, TierStats]:
    stats = TierStats()
    pf = Prefetcher(GuardedStore(store, "dict", stats), CODEC, PrefetchPolicy(**policy))  # type: ignore[arg-type]
    return pf, stats


def finish(pf: Prefetcher, key: str, timeout_s: float = 5.0) -> Fetched:
    deadline = time.monotonic() + timeout_s
    while (got := pf.poll(key)) is None:
        assert time.monotonic() < deadline, "prefetch never finished"
        pf.wait(0.05)
    return got


def test_fetches_in_prefix_order_in_batches() -> None:
    store = filled(7)
    pf, stats = prefetcher(store, batch_pages=3)
    pf.start("r", HASHES)
    got = finish(pf, "r")
    assert got.hashes == HASHES and [bytes(p) for p in got.payloads] == PAYLOADS and not got.timed_out
    assert store.gets == [3, 3, 1]
    snap = stats.snapshot()
    assert snap.prefetch == {"started": 1, "completed": 1} and snap.reads["store"] == 7
    assert "r" not in pf and pf.num_pending == 0


def test_take_hands_over_each_batch_as_it_arrives_and_poll_the_rest() -> None:
    store = filled(7, delay_s=10.0)  # every batch_get waits for the test's release
    pf, _ = prefetcher(store, batch_pages=3)
    pf.start("r", HASHES)
    assert pf.take("r").hashes == []  # nothing has arrived yet
    deadline = time.monotonic() + 5.0
    while len(store.gets) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    store.delay_s = 0.0  # the batches after the first go at once
    store.release.set()
    taken: list[bytes] = []
    payloads: list[bytes] = []
    while len(taken) < 3:  # the first batch, handed over while the job may still run
        assert time.monotonic() < deadline
        got = pf.take("r")
        taken += got.hashes
        payloads += [bytes(p) for p in got.payloads]
        time.sleep(0.01)
    rest = finish(pf, "r")
    assert taken + rest.hashes == HASHES  # each page once, in prefix order
    assert payloads + [bytes(p) for p in rest.payloads] == PAYLOADS
    assert not rest.timed_out and rest.bad is None and "r" not in pf


def test_stops_at_the_first_missing_or_corrupt_page() -> None:
    store = filled(7)
    key3 = HASHES[3].hex()
    store.data[key3] = store.data[key3][:-1] + bytes([store.data[key3][-1] ^ 1])  # flip the checksum
    pf, stats = prefetcher(store, batch_pages=2)
    pf.start("r", HASHES)
    got = finish(pf, "r")
    assert got.hashes == HASHES[:3] and [bytes(p) for p in got.payloads] == PAYLOADS[:3]
    assert store.gets == [2, 2]  # nothing read past the batch holding the bad page
    assert stats.snapshot().errors == {("dict", "corrupt"): 1}
    assert got.missing == ()  # the probe found all 7: the bad one is `bad`, not missing
    assert got.bad == HASHES[3]


def test_fewer_than_min_pages_in_l3_fetches_nothing() -> None:
    store = filled(1)
    pf, stats = prefetcher(store, min_pages=2)
    pf.start("r", HASHES)
    got = finish(pf, "r")
    assert got.hashes == [] and store.gets == [] and stats.snapshot().prefetch == {}
    assert got.missing == tuple(HASHES[1:])  # what the store lacks, from the first absent page


def test_the_deadline_holds_against_a_slow_store() -> None:
    store = filled(7, delay_s=10.0)
    pf, stats = prefetcher(store, timeout_base_s=0.2, timeout_per_page_s=0.01)
    t0 = time.monotonic()
    pf.start("r", HASHES)
    got = finish(pf, "r")
    waited = time.monotonic() - t0
    assert got.timed_out and got.hashes == []
    assert 0.2 <= waited < 0.2 + 7 * 0.01 + 0.15
    assert stats.snapshot().prefetch == {"started": 1, "timeouts": 1}
    store.release.set()  # let the stuck I/O thread go; its late result is dropped
    pf.close()


def test_a_store_that_is_down_is_an_empty_prefetch_and_a_counted_error() -> None:
    store = filled(7, fail=True)
    pf, stats = prefetcher(store)
    pf.start("r", HASHES)
    got = finish(pf, "r")
    assert got.hashes == [] and not got.timed_out
    assert stats.snapshot().errors == {("dict", "exists"): 1}
    assert not pf.store.available  # backing off: the next request does not even ask


def test_cancel_drops_the_job() -> None:
    store = filled(7, delay_s=10.0)
    pf, _ = prefetcher(store)
    pf.start("r", HASHES)
    pf.cancel("r")
    assert "r" not in pf
    with pytest.raises(KeyError):
        pf.poll("r")
    store.release.set()
    pf.close()
