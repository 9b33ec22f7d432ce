"""KVEventPublisher: the prefix cache's changes as KV events, published off the engine thread.

    engine thread: RadixPrefixCache hooks ──put_nowait──▶ queue ──▶ publisher thread:
        drain what is queued into one batch, int64 hashes, msgpack, PUB [topic, seq, payload],
        keep the last `buffer_steps` batches for the replay (ROUTER) socket

The engine never blocks on the network: a full queue drops the event (logged, counted in
`dropped`), and a consumer that sees a gap in the sequence numbers asks the replay socket.
Wire format: `event_wire.py`. `attach_kv_events(cache, cache_cfg)` is the one call the engine makes.
"""
from __future__ import annotations

import atexit
import collections
import itertools
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from kvstrata.kv.event_wire import (
    END_SEQ,
    MEDIUM_DEVICE,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
    KVEventsConfig,
    encode_batch,
    offset_endpoint,
    seq_bytes,
    seq_from_bytes,
    should_bind,
)
from kvstrata.kv.hashing import hash_to_int64

if TYPE_CHECKING:
    from kvstrata.config import CacheConfig
    from kvstrata.kv.radix import RadixPrefixCache

logger = logging.getLogger(__name__)

MAX_EVENTS_PER_BATCH = 1024
_STOP = object()


class KVEventPublisher:
    """Publishes one rank's cache events on `cfg.endpoint` offset by `rank` (port + rank).

    The hooks (`on_insert`, `on_evict`, `on_reset`) run on the engine thread and only enqueue;
    sockets are created here and then used by the publisher thread alone.
    """

    def __init__(self, cfg: KVEventsConfig, rank: int = 0, page_size: int = 16, medium: str = MEDIUM_DEVICE) -> None:
        import zmq  # heavy optional import, only when events are on

        self.rank = rank
        self.page_size = page_size
        self.medium = medium
        self.dropped = 0
        self.topic = cfg.topic
        self._topic = cfg.topic.encode()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=cfg.max_queue_size or 0)
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=cfg.buffer_steps)
        self._seq = itertools.count()
        ctx = zmq.Context.instance()
        self._pub = ctx.socket(zmq.PUB)
        self._pub.set_hwm(cfg.hwm)
        self._replay = None
        try:
            self.endpoint = self._open(self._pub, offset_endpoint(cfg.endpoint, rank))
            replay = offset_endpoint(cfg.replay_endpoint, rank)
            self.replay_endpoint = None
            if replay:
                self._replay = ctx.socket(zmq.ROUTER)
                self.replay_endpoint = self._open(self._replay, replay, always_bind=True)
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise ValueError(
                f"KV events: cannot open {cfg.endpoint!r} / {cfg.replay_endpoint!r} for rank {rank} ({exc}); "
                "pick free ports in --kv-events-config"
            ) from None
        self._thread = threading.Thread(target=self._run, name=f"kvstrata-kv-events-{rank}", daemon=True)
        self._thread.start()
        atexit.register(self.close)
        logger.info("kv_events_start rank=%d endpoint=%s replay=%s", rank, self.endpoint, self.replay_endpoint)

    @staticmethod
    def _open(sock: Any, endpoint: str | None, always_bind: bool = False) -> str:
        import zmq

        assert endpoint
        if always_bind or should_bind(endpoint):
            sock.bind(endpoint)
            return sock.getsockopt_string(zmq.LAST_ENDPOINT)  # the real port of "tcp://...:*"
        sock.connect(endpoint)
        return endpoint

    # -- hooks (engine thread) -------------------------------------------------------------------

    def on_insert(self, hashes: list[bytes], pages: list[int], token_lists: list[list[int]], parent: bytes | None) -> None:
        self._put(("stored", hashes, token_lists, parent))

    def on_evict(self, hashes: list[bytes], pages: list[int]) -> None:
        self._put(("removed", hashes))

    def on_reset(self, kept: int) -> None:
        if kept == 0:  # a flush that kept locked pages is exactly its BlockRemoved events
            self._put(("cleared",))

    def attach(self, cache: RadixPrefixCache) -> KVEventPublisher:
        cache.on_insert.append(self.on_insert)
        cache.on_evict.append(self.on_evict)
        cache.on_reset.append(self.on_reset)
        return self

    def _put(self, item: tuple[Any, ...]) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            if self.dropped & (self.dropped - 1) == 0:  # log 1, 2, 4, 8, ... drops
                logger.warning("kv_events_dropped rank=%d total=%d (raise max_queue_size)", self.rank, self.dropped)

    # -- publisher thread ------------------------------------------------------------------------

    def _event(self, item: tuple[Any, ...]) -> Event:
        kind = item[0]
        if kind == "stored":
            _, hashes, token_lists, parent = item
            tokens = [t for page in token_lists for t in page]
            parent_id = None if parent is None else hash_to_int64(parent)
            ids = [hash_to_int64(h) for h in hashes]
            return BlockStored(ids, parent_id, tokens, self.page_size, None, self.medium)
        if kind == "removed":
            return BlockRemoved([hash_to_int64(h) for h in item[1]], self.medium)
        return AllBlocksCleared()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            if self._replay is not None:
                try:
                    self._serve_replay()
                except Exception:  # a bad or unreachable replay client must not stop publishing
                    logger.exception("kv_events_replay_failed rank=%d", self.rank)
            try:
                item = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            items = [item]
            while len(items) < MAX_EVENTS_PER_BATCH:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if any(i is _STOP for i in items):
                stopping = True
                items = [i for i in items if i is not _STOP]
            if items:
                try:
                    self._send([self._event(i) for i in items])
                except Exception:  # a failed batch must not stop the thread
                    logger.exception("kv_events_publish_failed rank=%d", self.rank)

    def _send(self, events: list[Event]) -> None:
        seq = next(self._seq)
        payload = encode_batch(EventBatch(time.time(), events, self.rank))
        self._pub.send_multipart((self._topic, seq_bytes(seq), payload))
        self._buffer.append((seq, payload))

    def _serve_replay(self) -> None:
        """Answer waiting replay requests: every buffered batch from the asked sequence on."""
        import zmq

        assert self._replay is not None
        while self._replay.poll(0):
            frames = self._replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                logger.warning("kv_events_bad_replay_request frames=%d", len(frames))
                continue
            client, _, start = frames
            first = seq_from_bytes(start)
            for seq, payload in list(self._buffer):
                if seq >= first:
                    self._replay.send_multipart((client, b"", seq_bytes(seq), payload), flags=zmq.NOBLOCK)
            self._replay.send_multipart((client, b"", END_SEQ, b""), flags=zmq.NOBLOCK)

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self, timeout: float = 2.0) -> None:
        """Publish what is queued, stop the thread, close the sockets. Idempotent."""
        if self._thread.is_alive():
            try:
                self._queue.put(_STOP, timeout=timeout)
            except queue.Full:
                pass
            self._thread.join(timeout)
        if not self._thread.is_alive():  # sockets belong to the thread while it runs
            self._close_sockets()

    def _close_sockets(self) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None and not sock.closed:
                sock.close(linger=0)


def attach_kv_events(cache: RadixPrefixCache | None, cache_cfg: CacheConfig) -> KVEventPublisher | None:
    """A publisher hooked to `cache` when `--kv-events-config` enables events, else None."""
    cfg = KVEventsConfig.from_json(cache_cfg.kv_events_config)
    if not cfg.enabled:
        return None
    if cache is None:
        logger.warning("kv_events_off reason=prefix caching is disabled, so no pages are cached")
        return None
    publisher = KVEventPublisher(cfg, cache_cfg.data_parallel_rank, cache.page_size)
    return publisher.attach(cache)
