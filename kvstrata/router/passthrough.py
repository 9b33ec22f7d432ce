"""Streaming a rank's answer through the gateway: chunks as they come, and the request's in-flight
load on its rank undone exactly once however it ends (stream end, a broken upstream, a client
that left, an answer that never started)."""
from __future__ import annotations

import logging
from typing import AsyncIterator

import httpx

from kvstrata.router.workers import Worker

logger = logging.getLogger(__name__)


class Release:
    """Undo a request's in-flight load on its rank, exactly once (stream end, error or disconnect); its
    queued prefill (`prefill` uncached tokens) as soon as the rank answers (`begun`: the rank sends its
    headers once the first token is out) or with the rest."""

    def __init__(self, worker: Worker, cost: int, prefill: int = 0) -> None:
        self.worker, self.cost, self.prefill, self.done = worker, cost, prefill, False
        worker.requests += 1
        worker.tokens += cost
        worker.prefill_tokens += prefill

    def begun(self) -> None:
        self.worker.prefill_tokens -= self.prefill
        self.prefill = 0

    def __call__(self) -> None:
        if not self.done:
            self.done = True
            self.begun()
            self.worker.requests -= 1
            self.worker.tokens -= self.cost


async def passthrough(
    first: bytes, chunks: AsyncIterator[bytes], upstream: httpx.Response, release: Release
) -> AsyncIterator[bytes]:
    try:
        if first:
            yield first
        async for chunk in chunks:
            yield chunk
    except httpx.HTTPError as exc:
        logger.warning("router_stream_broken rank=%d error=%s", release.worker.rank, type(exc).__name__)
    finally:
        release()
        await upstream.aclose()


async def finish(upstream: httpx.Response, release: Release) -> None:
    release()
    await upstream.aclose()
