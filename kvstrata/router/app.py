"""The gateway's HTTP face: OpenAI routes proxied to a rank, plus /health, /metrics, /flush_cache.

`run_gateway` serves until interrupted (`kvstrata route`, `kvstrata serve --dp-size N`);
`GatewayThread` runs it in a thread of this process (tests).
"""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, AsyncIterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from kvstrata.config import RouterConfig, ServerConfig
from kvstrata.router.gateway import Gateway
from kvstrata.serving.errors import install_error_handlers
from kvstrata.serving.metrics import CONTENT_TYPE
from kvstrata.serving.server import UvicornThread

logger = logging.getLogger(__name__)


def build_gateway_app(gateway: Gateway) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = FastAPI(title="kvstrata gateway", lifespan=lifespan)
    app.state.gateway = gateway
    install_error_handlers(app)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        started = time.perf_counter()
        return await gateway.proxy("/v1/chat/completions", await request.body(), dict(request.headers), started)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        started = time.perf_counter()
        return await gateway.proxy("/v1/completions", await request.body(), dict(request.headers), started)

    @app.get("/v1/models")
    async def models() -> Response:
        return await gateway.get_json("/v1/models")

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Response:
        return await gateway.get_json(f"/v1/models/{model_id}")

    @app.get("/health")
    async def health() -> JSONResponse:
        ranks = [
            {
                "rank": w.rank, "url": w.url, "status": w.status, "in_flight_requests": w.requests,
                "in_flight_tokens": w.tokens, "kv_events": "on" if w.subscriber else "approximate",
                "cached_blocks": len(w.index),
            }
            for w in gateway.pool.workers
        ]
        statuses = {r["status"] for r in ranks}
        status = "ready" if "ready" in statuses else "loading" if statuses & {"loading", "unknown"} else "dead"
        body: dict[str, Any] = {
            "status": status, "policy": gateway.policy.name, "ranks": ranks,
            "overhead_ms": gateway.metrics.overhead_ms(),
        }
        return JSONResponse(body, status_code=200 if status == "ready" else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        answers = await gateway.fan_out("GET", "/metrics")
        texts = {rank: r.text for rank, r in answers.items() if r is not None and r.status_code == 200}
        return Response(gateway.metrics.render(texts), media_type=CONTENT_TYPE)

    @app.post("/flush_cache")
    async def flush_cache() -> JSONResponse:
        answers = await gateway.fan_out("POST", "/flush_cache")
        per_rank = {str(rank): (r.json() if r is not None and r.status_code == 200 else None) for rank, r in answers.items()}
        freed = sum(a.get("freed_pages", 0) for a in per_rank.values() if a)
        ok = all(a is not None for a in per_rank.values())
        return JSONResponse({"status": "ok" if ok else "partial", "freed_pages": freed, "ranks": per_rank})

    return app


def _uvicorn_config(gateway: Gateway, server_cfg: ServerConfig) -> uvicorn.Config:
    return uvicorn.Config(
        build_gateway_app(gateway), host=server_cfg.host, port=server_cfg.port, log_level=server_cfg.log_level,
        timeout_graceful_shutdown=5, lifespan="on",
    )


def run_gateway(urls: list[str], server_cfg: ServerConfig, router_cfg: RouterConfig) -> None:
    """Serve the gateway until interrupted (blocking)."""
    gateway = Gateway(urls, router_cfg)
    logger.info(
        "gateway_start host=%s port=%d policy=%s ranks=%s", server_cfg.host, server_cfg.port, router_cfg.policy,
        ",".join(urls),
    )
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(_uvicorn_config(gateway, server_cfg)).run()
    logger.info("gateway_stop")


class GatewayThread(UvicornThread):
    """The gateway in a background thread: `start()` returns once it listens."""

    def __init__(self, urls: list[str], router_cfg: RouterConfig, server_cfg: ServerConfig | None = None) -> None:
        self.gateway = Gateway(urls, router_cfg)
        self.server_cfg = server_cfg or ServerConfig(port=0)
        cfg = self.server_cfg
        super().__init__(_uvicorn_config(self.gateway, cfg), cfg.host, cfg.port, "kvstrata-gateway")
