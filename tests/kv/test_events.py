"""KV events: a real ZMQ subscriber decodes what the publisher sends and rebuilds the cache's pages."""
from __future__ import annotations

import hashlib
import random
import time
from pathlib import Path
from typing import Any, Iterator

import msgpack
import pytest
import torch
import zmq

from kvstrata.config import CacheConfig
from kvstrata.engine.llm import LLM
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.kv.event_wire import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventsConfig,
    decode_batch,
    offset_endpoint,
    seq_bytes,
    seq_from_bytes,
)
from kvstrata.kv.events import KVEventPublisher, attach_kv_events
from kvstrata.kv.hashing import hash_pages, hash_to_int64, namespace_root
from kvstrata.kv.pool import PagePool
from kvstrata.kv.radix import RadixPrefixCache

PS = 4
LOOPBACK = "tcp://127.0.0.1:*"  # bind a free port; the publisher reports the real one


def make_cache(num_pages: int = 48) -> tuple[PagePool, RadixPrefixCache]:
    pool = PagePool(num_pages, PS, layers=1, kv_heads=1, head_dim=1, dtype=torch.float32)
    return pool, RadixPrefixCache(pool, PS, namespace_root("test/model", "float32", PS, "nhd"))


def cached_ids(cache: RadixPrefixCache) -> set[int]:
    return {hash_to_int64(node.hash) for node in cache._page_node.values()}  # noqa: SLF001 - the truth


def apply(blocks: set[int], payload: bytes) -> None:
    for ev in decode_batch(payload).events:
        if isinstance(ev, BlockStored):
            blocks.update(ev.block_hashes)
        elif isinstance(ev, BlockRemoved):
            blocks.difference_update(ev.block_hashes)
        else:
            blocks.clear()


def put(pool: PagePool, cache: RadixPrefixCache, tokens: list[int], key: str | None = None) -> None:
    """Cache `tokens` as a finished request would, evicting when the pool is full."""
    m = cache.match(tokens + [0], key)
    need = len(tokens) // PS - len(m.pages)
    if need <= 0:
        return
    cache.lock(m.node)  # as a running request does: its matched pages must survive the eviction
    if need > pool.num_free:
        cache.evict(need - pool.num_free)
    pool.free(cache.insert(tokens, m.pages + pool.alloc(need), key))
    cache.unlock(m.node)


def probe(publisher: KVEventPublisher, n: int) -> int:
    """Publish BlockRemoved of a hash no cache holds (a no-op for any subscriber's set); its id."""
    page_hash = hashlib.sha256(b"subscriber probe %d" % n).digest()
    publisher.on_evict([page_hash], [])
    return hash_to_int64(page_hash)


class Subscriber:
    """What an outside router does: SUB to the endpoint, apply every batch to a set of block hashes.

    A PUB drops what it sends before a new subscription reaches it (ZMQ's slow joiner), so the
    constructor publishes probes until one arrives, then one more as a fence, and receives up to the
    fence: every batch after it reaches `frames`, from sequence number `first_seq` on.
    """

    def __init__(self, publisher: KVEventPublisher, topic: bytes = b"", timeout: float = 30.0) -> None:
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(publisher.endpoint)
        self.blocks: set[int] = set()
        self.seqs: list[int] = []
        self.frames: list[list[bytes]] = []
        self.first_seq = self._wait_live(publisher, timeout)

    def _wait_live(self, publisher: KVEventPublisher, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        sent, fence = 0, None
        while time.monotonic() < deadline:
            if fence is None:  # not live yet: probe again
                probe(publisher, sent)
                sent += 1
            if not self.sock.poll(100):
                continue
            _, seq, payload = self.sock.recv_multipart()
            removed = {h for e in decode_batch(payload).events if isinstance(e, BlockRemoved) for h in e.block_hashes}
            if fence is None:  # live: everything published from now on arrives, in order
                fence = probe(publisher, sent)
            elif fence in removed:
                return seq_from_bytes(seq) + 1
        raise AssertionError(f"no probe reached the subscriber in {timeout}s")

    def apply(self, payload: bytes) -> None:
        apply(self.blocks, payload)

    def drain(self, until: set[int], timeout: float = 5.0) -> None:
        """Receive until the rebuilt set equals `until` (or time out)."""
        deadline = time.monotonic() + timeout
        while self.blocks != until and time.monotonic() < deadline:
            if self.sock.poll(50):
                frames = self.sock.recv_multipart()
                self.frames.append(frames)
                self.seqs.append(seq_from_bytes(frames[1]))
                self.apply(frames[2])

    def close(self) -> None:
        self.sock.close(linger=0)


@pytest.fixture()
def publisher() -> Iterator[KVEventPublisher]:
    pub = KVEventPublisher(KVEventsConfig(True, "zmq", LOOPBACK, LOOPBACK, buffer_steps=1000), rank=3, page_size=PS)
    yield pub
    pub.close()


def test_wire_format_three_frames_and_positional_events(publisher: KVEventPublisher) -> None:
    pool, cache = make_cache()
    publisher.attach(cache)
    sub = Subscriber(publisher)
    tokens = list(range(100, 111))  # two full pages and a partial one
    cache.insert(tokens, pool.alloc(2))
    hashes = [hash_to_int64(h) for h in hash_pages(tokens, PS, cache.root)]
    sub.drain(set(hashes))
    topic, seq, payload = sub.frames[0]
    assert topic == b"" and seq == sub.first_seq.to_bytes(8, "big")
    ts, events, rank = msgpack.unpackb(payload)
    assert isinstance(ts, float) and abs(ts - time.time()) < 60 and rank == 3
    assert events == [["BlockStored", hashes, None, tokens[:8], PS, None, "GPU"]]
    assert all(-(2**63) <= h < 2**63 for h in hashes)
    cache.insert(tokens[:8] + [7, 7, 7, 7], [*cache.match(tokens[:9]).pages, *pool.alloc(1)])
    child = hash_pages(tokens[:8] + [7, 7, 7, 7], PS, cache.root)[2]
    sub.drain(set(hashes) | {hash_to_int64(child)})
    assert msgpack.unpackb(sub.frames[1][2])[1] == [
        ["BlockStored", [hash_to_int64(child)], hashes[1], [7, 7, 7, 7], PS, None, "GPU"]
    ]
    assert sub.seqs == [sub.first_seq, sub.first_seq + 1]
    sub.close()


def test_subscriber_rebuilds_the_page_set_exactly_and_replay_agrees(publisher: KVEventPublisher) -> None:
    pool, cache = make_cache()
    publisher.attach(cache)
    sub = Subscriber(publisher)
    rng = random.Random(7)
    prefixes = [[rng.randrange(50) for _ in range(8)] for _ in range(3)]
    for step in range(60):
        tokens = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(0, 14))]
        put(pool, cache, tokens, rng.choice([None, None, "tenant"]))
        if step % 13 == 12:
            cache.evict(rng.randrange(1, 6))
        sub.drain(cached_ids(cache))
        assert sub.blocks == cached_ids(cache), step
    cache.check_integrity()
    assert sub.seqs == list(range(sub.first_seq, sub.first_seq + len(sub.seqs)))
    # a late subscriber asks the replay socket for everything from sequence 0 and agrees
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(publisher.replay_endpoint)
    dealer.send_multipart([b"", seq_bytes(0)])
    late: set[int] = set()
    replayed = []
    while True:
        assert dealer.poll(5000)
        empty, seq, payload = dealer.recv_multipart()
        if seq == END_SEQ:
            break
        replayed.append(seq_from_bytes(seq))
        apply(late, payload)
    assert replayed == list(range(sub.first_seq)) + sub.seqs and late == cached_ids(cache)  # probes included
    dealer.close(linger=0)
    # a flush while a running request locks 2 pages: exact BlockRemoved events, no AllBlocksCleared
    put(pool, cache, prefixes[0])
    locked = cache.match(prefixes[0] + [0]).node
    cache.lock(locked)
    cache.reset()
    sub.drain(cached_ids(cache))
    assert sub.blocks == cached_ids(cache) and len(sub.blocks) == 2
    assert not any(isinstance(e, AllBlocksCleared) for f in sub.frames for e in decode_batch(f[2]).events)
    cache.unlock(locked)
    cache.reset()  # now the flush empties the cache: AllBlocksCleared
    sub.drain(set())
    assert sub.blocks == set() and decode_batch(sub.frames[-1][2]).events[-1] == AllBlocksCleared()
    sub.close()


def test_engine_publishes_what_its_cache_holds(tiny_model_dir: Path) -> None:
    events = '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "%s"}' % LOOPBACK
    llm = LLM(str(tiny_model_dir), dtype="float32", max_total_tokens=1024, kv_events_config=events, data_parallel_rank=1)
    pub = llm.engine.kv_events
    assert pub is not None and pub.rank == 1
    sub = Subscriber(pub)
    rng = random.Random(3)
    shared = [rng.randrange(3, 49000) for _ in range(40)]
    prompts: list[Any] = [shared + [rng.randrange(3, 49000) for _ in range(n)] for n in (10, 30, 70)]
    llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    cache = llm.engine.prefix_cache
    assert cache is not None and cache.num_cached_pages >= 6
    sub.drain(cached_ids(cache))
    assert sub.blocks == cached_ids(cache)
    assert {decode_batch(f[2]).data_parallel_rank for f in sub.frames} == {1}
    llm.engine.flush_cache()
    sub.drain(set())
    assert sub.blocks == set()
    sub.close()
    pub.close()


def test_config_json_and_rank_offsets() -> None:
    cfg = KVEventsConfig.from_json('{"enable_kv_cache_events": true, "publisher": "zmq", "topic": "kv"}')
    assert cfg.enabled and cfg.endpoint == "tcp://*:5557" and cfg.buffer_steps == 10_000
    assert not KVEventsConfig.from_json(None).enabled
    assert not KVEventsConfig.from_json('{"enable_kv_cache_events": true, "publisher": "null"}').enabled
    with pytest.raises(ValueError, match="unknown keys \\['endpont'\\]"):
        KVEventsConfig.from_json('{"endpont": "tcp://*:1"}')
    with pytest.raises(ValueError, match="publisher 'kafka'"):
        KVEventsConfig.from_json('{"publisher": "kafka"}')
    with pytest.raises(ValueError, match="not valid JSON"):
        KVEventsConfig.from_json("{enable: 1}")
    assert offset_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint("tcp://10.0.0.1:6000", 1) == "tcp://10.0.0.1:6001"
    assert offset_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"
    assert offset_endpoint("tcp://127.0.0.1:*", 5) == "tcp://127.0.0.1:*"
    assert attach_kv_events(None, CacheConfig(kv_events_config='{"enable_kv_cache_events": true, "publisher": "zmq"}')) is None
