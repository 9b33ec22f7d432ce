"""Operational routes: Prometheus `/metrics` and `POST /flush_cache`."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from kvstrata.serving.metrics import CONTENT_TYPE
from kvstrata.serving.state import ServerState


def install_admin_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/flush_cache")
    async def flush_cache() -> JSONResponse:
        """Empty the prefix cache; pages that running requests use stay until they finish."""
        engine = state.ready_engine()
        freed = await engine.call(lambda eng: eng.flush_cache())
        return JSONResponse({"status": "ok", "freed_pages": freed})
