"""Operational routes: Prometheus `/metrics`, the `/dashboard` page over it, `POST /flush_cache`,
`GET /response_cache` and its flush."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from kvstrata.metrics import CONTENT_TYPE
from kvstrata.serving.dashboard import install_dashboard_route
from kvstrata.serving.state import ServerState


def install_admin_routes(app: FastAPI, state: ServerState) -> None:
    install_dashboard_route(app)  # GET /dashboard, charts of /metrics

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/flush_cache")
    async def flush_cache() -> JSONResponse:
        """Empty the prefix cache; pages that running requests use stay until they finish."""
        engine = state.ready_engine()
        freed = await engine.call(lambda eng: eng.flush_cache())
        return JSONResponse({"status": "ok", "freed_pages": freed})

    @app.get("/response_cache")
    async def response_cache() -> JSONResponse:
        """size, list_size, entries, fixed_keys, hits, misses, evictions (and whether it is on)."""
        return JSONResponse(state.response_cache.stats())

    @app.post("/response_cache/flush")
    async def flush_response_cache() -> JSONResponse:
        """Drop every stored response (fixed keys stay fixed, counters keep counting)."""
        return JSONResponse({"status": "ok", "flushed_keys": state.response_cache.flush()})
