"""KVEventSubscriber: one rank's KV events (ZMQ SUB) applied to its RankCacheIndex, in a thread.

On start it asks the replay socket for every batch it still buffers, so a gateway that joins a
running rank learns what it already holds. A gap in the sequence numbers (a slow joiner, a full
HWM) is filled from the replay socket; batches it already applied are skipped. A restarted rank
(its sequence starts again at 0) is handled by the gateway, which sees it go down and back up and
starts a new subscriber on an empty index.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from kvstrata.kv.event_wire import END_SEQ, decode_batch, seq_bytes, seq_from_bytes
from kvstrata.router.cache_index import RankCacheIndex

logger = logging.getLogger(__name__)

POLL_MS = 100
REPLAY_TIMEOUT_MS = 2000


class KVEventSubscriber:
    def __init__(
        self, rank: int, endpoint: str, replay_endpoint: str | None, topic: str, index: RankCacheIndex
    ) -> None:
        self.rank = rank
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.index = index
        self.batches = 0  # applied, live or replayed
        self._next_seq: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kvstrata-kv-sub-{rank}", daemon=True)

    def start(self) -> KVEventSubscriber:
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _apply(self, seq: int, payload: bytes) -> None:
        if self._next_seq is not None and seq < self._next_seq:
            return  # already applied (replay and live overlap)
        try:
            self.index.apply(decode_batch(payload))
        except (ValueError, TypeError, IndexError) as exc:
            logger.warning("kv_event_bad_batch rank=%d seq=%d error=%s", self.rank, seq, exc)
        self._next_seq = seq + 1
        self.batches += 1

    def _replay(self, ctx: Any, start: int, before: int | None) -> None:
        """Apply buffered batches with start <= seq (< before); what the buffer lost stays lost."""
        import zmq

        if not self.replay_endpoint:
            if before is not None:
                logger.warning("kv_event_gap rank=%d missing=%d..%d (no replay endpoint)", self.rank, start, before - 1)
            return
        sock = ctx.socket(zmq.DEALER)
        sock.connect(self.replay_endpoint)
        try:
            sock.send_multipart([b"", seq_bytes(start)])
            while not self._stop.is_set():
                if not sock.poll(REPLAY_TIMEOUT_MS):
                    logger.warning("kv_event_replay_timeout rank=%d endpoint=%s", self.rank, self.replay_endpoint)
                    return
                frames = sock.recv_multipart()
                if len(frames) != 3 or frames[1] == END_SEQ:
                    return
                seq = seq_from_bytes(frames[1])
                if before is None or seq < before:
                    self._apply(seq, frames[2])
        finally:
            sock.close(linger=0)

    def _run(self) -> None:
        import zmq

        ctx = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        sub.connect(self.endpoint)
        logger.info("kv_event_subscribe rank=%d endpoint=%s replay=%s", self.rank, self.endpoint, self.replay_endpoint)
        try:
            self._replay(ctx, 0, None)  # what the rank cached before we joined
            while not self._stop.is_set():
                if not sub.poll(POLL_MS):
                    continue
                frames = sub.recv_multipart()
                if len(frames) != 3:
                    logger.warning("kv_event_bad_message rank=%d frames=%d", self.rank, len(frames))
                    continue
                seq = seq_from_bytes(frames[1])
                expected = self._next_seq or 0
                if seq > expected:
                    self._replay(ctx, expected, seq)
                self._apply(seq, frames[2])
        except Exception:  # never take the gateway down; routing degrades to an emptier index
            logger.exception("kv_event_subscriber_failed rank=%d", self.rank)
        finally:
            sub.close(linger=0)
