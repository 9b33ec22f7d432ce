"""Prefetcher: bring a waiting request's prefix from L3 before it is admitted, within a deadline.

    engine thread: start(key, hashes)  ->  poll(key) ... None (still fetching) ... -> Fetched
    I/O thread:    batch_exists(hashes) -> fewer than min_pages: done, nothing to fetch
                   else batch_get in batches of batch_pages, in prefix order, decoding each value,
                   until the first miss (absent, corrupt, foreign) or the deadline

The deadline is `start + base_s` for the existence probe, then `start + base_s + per_page_s x pages`.
The engine thread enforces it: `poll` past the deadline returns what has arrived and abandons the
job (a store stuck in a call keeps its I/O thread, never the request). Results cross threads only
through `_Job` fields guarded by its lock; the caller puts the pages into L2 on the engine thread,
each batch as it arrives (`take`), so a long prefix is never held twice in memory: a batch's values
are freed once copied into L2, and the next batch's reads reuse that memory instead of faulting in
fresh pages, which was most of what restoring an agent's prefix cost (docs/kv-tiers.md, "Restore speed").
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

from kvstrata.kv.page_codec import PageCodec
from kvstrata.kv.store.guard import GuardedStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrefetchPolicy:
    min_pages: int = 2
    timeout_base_s: float = 1.0
    timeout_per_page_s: float = 0.01
    batch_pages: int = 16  # each read's values are put into L2 before the next: few pages keep fresh memory small
    max_pages: int = 1 << 30  # at most this many pages per request (L2 must hold them)


class Fetched(NamedTuple):
    hashes: list[bytes]  # the leading pages fetched, in prefix order
    payloads: list[memoryview]  # their page bytes (decoded, checked)
    timed_out: bool
    bad: bytes | None = None  # the page whose stored value was corrupt, truncated or foreign
    missing: tuple[bytes, ...] = ()  # the pages the store lacked, from the first absent one (the probe)


@dataclass
class _Job:
    hashes: list[bytes]
    deadline: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    fetched: list[tuple[bytes, memoryview]] = field(default_factory=list)
    bad: bytes | None = None
    missing: list[bytes] = field(default_factory=list)
    done: bool = False
    abandoned: bool = False


class Prefetcher:
    def __init__(self, store: GuardedStore, codec: PageCodec, policy: PrefetchPolicy, workers: int = 2) -> None:
        self.store = store
        self.codec = codec
        self.policy = policy
        self._jobs: dict[str, _Job] = {}
        self._wake = threading.Event()
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kvstrata-kvstore-prefetch")

    def __contains__(self, key: str) -> bool:
        return key in self._jobs

    @property
    def num_pending(self) -> int:
        return len(self._jobs)

    def start(self, key: str, hashes: list[bytes]) -> None:
        """Engine thread: look for `hashes` (the pages after L1+L2, prefix order) in L3."""
        job = _Job(hashes[: self.policy.max_pages], time.monotonic() + self.policy.timeout_base_s)
        self._jobs[key] = job
        self._executor.submit(self._run, job)

    def take(self, key: str) -> Fetched:
        """Engine thread: the pages fetched since the last take (prefix order), while the job goes on;
        `poll` then returns only the pages after them."""
        job = self._jobs[key]
        with job.lock:
            fetched, job.fetched = job.fetched, []
        return Fetched([h for h, _ in fetched], [p for _, p in fetched], False)

    def poll(self, key: str) -> Fetched | None:
        """Engine thread: None while the job runs within its deadline; else its result (once): the pages
        not taken yet, whether it timed out, the bad and the missing pages."""
        job = self._jobs[key]
        with job.lock:
            timed_out = not job.done and time.monotonic() >= job.deadline
            if not (job.done or timed_out):
                return None
            job.abandoned = True
            fetched, bad, missing = list(job.fetched), job.bad, job.missing
        del self._jobs[key]
        if timed_out:
            self.store.stats.prefetch("timeouts")
            logger.info("kvstore_prefetch_timeout key=%s fetched=%d of %d", key, len(fetched), len(job.hashes))
        return Fetched([h for h, _ in fetched], [p for _, p in fetched], timed_out, bad, tuple(missing))

    def cancel(self, key: str) -> None:
        job = self._jobs.pop(key, None)
        if job is not None:
            with job.lock:
                job.abandoned = True

    def next_deadline(self) -> float | None:
        return min((j.deadline for j in self._jobs.values()), default=None)

    def wait(self, timeout_s: float) -> None:
        """Engine thread with nothing to run: sleep until a job finishes, a deadline, or `timeout_s`."""
        deadline = self.next_deadline()
        if deadline is not None:
            timeout_s = max(0.0, min(timeout_s, deadline - time.monotonic()))
        self._wake.wait(timeout_s)
        self._wake.clear()

    def close(self) -> None:
        for key in list(self._jobs):
            self.cancel(key)
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- I/O thread ------------------------------------------------------------------------------

    def _run(self, job: _Job) -> None:
        try:
            self._fetch(job)
        except Exception:  # noqa: BLE001 - never leave a request waiting on a dead job
            logger.exception("kvstore_prefetch_failed pages=%d", len(job.hashes))
        finally:
            with job.lock:
                job.done = True
            self._wake.set()

    def _fetch(self, job: _Job) -> None:
        policy, stats = self.policy, self.store.stats
        if job.abandoned or time.monotonic() >= job.deadline:
            return  # waited in the queue past its deadline (or cancelled): do not even ask
        keys = [h.hex() for h in job.hashes]
        n = self.store.batch_exists(keys)
        with job.lock:
            job.missing = job.hashes[n:]
        if n < policy.min_pages:
            return
        with job.lock:
            if job.abandoned:
                return
            job.deadline += policy.timeout_per_page_s * n
        stats.prefetch("started")
        for off in range(0, n, policy.batch_pages):
            batch = keys[off : min(n, off + policy.batch_pages)]
            values = self.store.batch_get(batch)
            got: list[tuple[bytes, memoryview]] = []
            for h, value in zip(job.hashes[off:], values):
                payload, miss = self.codec.decode(h, value)
                if payload is None:
                    if miss is not None:
                        stats.error(self.store.backend, miss)
                        job.bad = h
                    break
                got.append((h, payload))
            stats.read("store", len(got), len(got) * self.codec.value_bytes)
            with job.lock:
                if job.abandoned or time.monotonic() >= job.deadline:
                    return  # the engine thread counts the timeout
                job.fetched.extend(got)
            if len(got) < len(batch):
                break  # first miss: the rest of the prefix cannot be used
        stats.prefetch("completed")
