"""`GET /health`: 200 {"status": "ready"}, else 503 with "loading", "draining" or "dead".

`GET /health?deep=1` also runs the page pool's and the caches' `check_integrity()` on the engine
thread (between steps) and reports the pages: free, cached (held by the prefix cache) and in use
by requests. A failed check answers 503 {"status": "corrupt", "error": ...}. /health needs no API key.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from kvstrata.serving.state import ServerState

if TYPE_CHECKING:
    from kvstrata.engine.engine import Engine

logger = logging.getLogger(__name__)
DEEP_TIMEOUT_S = 10.0  # a step is milliseconds; an engine thread this late is stuck


def page_report(engine: Engine) -> dict[str, Any]:
    """Check the pool and caches (raises AssertionError on a broken invariant) and count pages."""
    engine.check_integrity()
    pool = engine.pool
    cache, kv = engine.prefix_cache, engine.scheduler.kv
    cached = cache.num_cached_pages if cache is not None else 0
    return {
        "total": pool.num_pages,
        "free": pool.num_free,
        "cached": cached,
        "tails": kv.kept_pages - cached,
        "in_use": pool.num_in_use - kv.kept_pages,
        "evictable": kv.evictable_pages,
        "requests_running": engine.num_running,
        "requests_waiting": engine.num_waiting,
    }


def install_health_route(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def health(deep: bool = False) -> JSONResponse:
        status = state.status
        body: dict[str, Any] = {"status": status}
        if status == "dead":
            body["error"] = state.load_error or "the engine thread died; see the server log"
        if status != "ready" or not deep or state.engine is None:
            return JSONResponse(body, status_code=200 if status == "ready" else 503)
        try:
            body["pages"] = await asyncio.wait_for(state.engine.call(page_report), DEEP_TIMEOUT_S)
        except asyncio.TimeoutError:
            return JSONResponse({"status": "unresponsive", "error": "the engine thread did not answer"}, 503)
        except AssertionError as exc:
            logger.error("integrity_check_failed error=%s", exc)
            return JSONResponse({"status": "corrupt", "error": str(exc)}, status_code=503)
        return JSONResponse(body)
