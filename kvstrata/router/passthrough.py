"""A rank's answer through the gateway. A routed request's is streamed: chunks as they come, and the
request's in-flight load on its rank undone exactly once however it ends (stream end, a broken upstream,
a client that left, an answer that never started). A request every rank answers alike (/v1/models,
/tokenize) goes to `any_rank`: no routing, no load counted, the whole answer read at once."""
from __future__ import annotations

import logging
import time
from typing import AsyncIterator

import httpx
from fastapi.responses import Response

from kvstrata.router.workers import Worker, WorkerPool
from kvstrata.serving.errors import APIError

logger = logging.getLogger(__name__)


class Release:
    """Undo a request's in-flight load on its rank, exactly once (stream end, error or disconnect); its
    queued prefill (`prefill` uncached tokens) as soon as the rank answers (`begun`: the rank sends its
    headers once the first token is out) or with the rest."""

    def __init__(self, worker: Worker, cost: int, prefill: int = 0, now: float | None = None) -> None:
        self.worker, self.cost, self.prefill, self.done = worker, cost, prefill, False
        worker.requests += 1
        worker.tokens += cost
        worker.prefill.sent(id(self), prefill, time.monotonic() if now is None else now)

    def begun(self, ok: bool = False, now: float | None = None) -> None:
        """The answer started (`ok`: a reply, status 200, whose wait times the rank's prefill), or the request
        ended without one. A second call is a no-op (nothing left to answer)."""
        self.worker.prefill.answered(id(self), self.prefill, time.monotonic() if now is None else now, learn=ok)
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


async def any_rank(
    pool: WorkerPool, client: httpx.AsyncClient, method: str, path: str, headers: dict[str, str],
    content: bytes | None = None, timeout_s: float = 10.0,
) -> Response:
    """The answer of the least-loaded ready rank (the next one when a rank cannot be reached), with its
    status and body as they are and the rank in `x-kvstrata-rank`; 503 no_rank_ready when none answers."""
    for w in sorted(pool.ready(), key=lambda w: (w.tokens, w.requests)):
        try:
            resp = await client.request(method, w.url + path, content=content, headers=headers, timeout=timeout_s)
        except httpx.TransportError as exc:
            pool.mark_down(w, f"{type(exc).__name__} on {method} {path}")
            continue
        return Response(resp.content, status_code=resp.status_code, media_type="application/json",
                        headers={"x-kvstrata-rank": str(w.rank)})
    raise APIError(503, "no engine rank is ready; retry when GET /health returns 200", "server_error",
                   code="no_rank_ready")
