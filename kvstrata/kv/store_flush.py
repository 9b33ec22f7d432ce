"""flush_to_store: at shutdown, write to L3 every page that only this process holds.

    L1 (radix cache) pages and L2 (host tier) pages whose hash the StoreWriter does not know
      (their write-through failed or was dropped: the store was down, slow or full)
    -> copied out in chunks -> StoreWriter.submit_snapshot -> drained, all within `timeout_s`

Runs after the engine thread has stopped (nothing changes L1 or L2 meanwhile). Pages the writer
knows are already in the store, or still queued for it: the drain covers those. A store that is
down makes the flush skip what it cannot write, never wait past the deadline.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future, wait
from typing import NamedTuple

import numpy as np
import torch

from kvstrata.kv.host_tier import HostTier
from kvstrata.kv.page_io import snapshot_pages
from kvstrata.kv.radix import RadixPrefixCache
from kvstrata.kv.store_writer import StoreWriter

logger = logging.getLogger(__name__)


class FlushReport(NamedTuple):
    l1_pages: int  # L1 pages the store was not known to hold
    l2_pages: int  # L2 pages (not also in L1) the store was not known to hold
    flushed: int  # of those, pages the store holds after the flush
    drained: bool  # every queued write finished before the deadline

    @property
    def skipped(self) -> int:
        return self.l1_pages + self.l2_pages - self.flushed


def flush_to_store(
    cache: RadixPrefixCache, host: HostTier, writer: StoreWriter, timeout_s: float, chunk_pages: int = 64
) -> FlushReport:
    """Write L1 and L2 pages unknown to the store, then drain every queued write; bounded by `timeout_s`."""
    started = time.monotonic()
    deadline = started + timeout_s
    l1 = [(h, p) for h, p in cache.cached_entries() if not writer.is_known(h)]
    in_l1 = {h for h, _ in l1}
    l2 = [h for h in host.hashes() if h not in in_l1 and not writer.is_known(h)]
    futures: list[Future[int]] = []
    if (l1 or l2) and writer.store.wait_available(deadline - time.monotonic()):
        for off in range(0, len(l1), chunk_pages):
            chunk = l1[off : off + chunk_pages]
            snapshot = snapshot_pages(cache.pool, [p for _, p in chunk])  # [n, 2, layers, ps, kvh, hd]
            if not _queue(writer, [h for h, _ in chunk], snapshot, deadline, futures):
                break
        else:
            for off in range(0, len(l2), chunk_pages):
                chunk2 = l2[off : off + chunk_pages]
                snapshot = torch.from_numpy(np.stack([host.page_view(h) for h in chunk2]))  # [n, page_bytes]
                if not _queue(writer, chunk2, snapshot, deadline, futures):
                    break
    wait(futures, timeout=max(0.0, deadline - time.monotonic()))  # done, not just off the queue
    drained = writer.drain(max(0.0, deadline - time.monotonic()))  # and the writes queued before
    flushed = sum(f.result() for f in futures if f.done() and not f.cancelled())
    report = FlushReport(len(l1), len(l2), flushed, drained)
    logger.info(
        "kvstore_flush l1_pages=%d l2_pages=%d flushed=%d skipped=%d drained=%s seconds=%.2f",
        report.l1_pages, report.l2_pages, report.flushed, report.skipped, drained, time.monotonic() - started,
    )
    return report


def _queue(
    writer: StoreWriter, hashes: list[bytes], snapshot: torch.Tensor, deadline: float, futures: list[Future[int]]
) -> bool:
    future = writer.submit_snapshot(hashes, snapshot, max(0.0, deadline - time.monotonic()))
    if future is None:
        return False
    futures.append(future)
    return True
