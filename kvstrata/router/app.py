"""The gateway's HTTP face: OpenAI routes proxied to a rank, plus /health, /metrics, /dashboard, /flush_cache.

It checks API keys itself (the rank's middleware and key sources: `--api-key`, `--api-key-file`,
$KVSTRATA_API_KEY; the dashboard cookie too) and forwards the client's `Authorization` header, so
the rank puts the request in that key's tenant. Its own calls to ranks (info, /metrics, flush)
carry one of its keys: give the ranks the same keys. `/metrics` merges the ranks' series (each
with a `rank` label), which is what the `/dashboard` page sums over.

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
from kvstrata.serving.auth import ApiKeys, AuthMiddleware
from kvstrata.serving.dashboard import install_dashboard_route
from kvstrata.serving.errors import install_error_handlers
from kvstrata.serving.http_protocol import JsonErrorH11Protocol
from kvstrata.serving.limits import PARSER_BUFFER_BYTES, RequestLimitsMiddleware
from kvstrata.serving.metrics import CONTENT_TYPE
from kvstrata.serving.response_cache.service import CacheHeaderOnErrors
from kvstrata.serving.server import UvicornThread

logger = logging.getLogger(__name__)


def build_gateway_app(gateway: Gateway, server_cfg: ServerConfig, keys: ApiKeys) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = FastAPI(title="kvstrata gateway", lifespan=lifespan, redirect_slashes=False)
    app.state.gateway = gateway
    install_error_handlers(app)
    app.add_middleware(RequestLimitsMiddleware, max_body_bytes=server_cfg.max_request_body_bytes,
                       max_json_depth=server_cfg.max_json_depth, body_timeout_s=server_cfg.request_body_timeout)
    app.add_middleware(AuthMiddleware, keys=keys, metrics_public=server_cfg.metrics_public)
    app.add_middleware(CacheHeaderOnErrors)  # the gateway's own errors say "bypass" too
    install_dashboard_route(app)  # GET /dashboard, charts of the merged /metrics below

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        started = time.perf_counter()
        return await gateway.proxy("/v1/chat/completions", await request.body(), dict(request.headers), started)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        started = time.perf_counter()
        return await gateway.proxy("/v1/completions", await request.body(), dict(request.headers), started)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return await gateway.get_json("/v1/models", dict(request.headers))

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> Response:
        return await gateway.get_json(f"/v1/models/{model_id}", dict(request.headers))

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


def _uvicorn_config(gateway: Gateway, server_cfg: ServerConfig, keys: ApiKeys) -> uvicorn.Config:
    return uvicorn.Config(
        build_gateway_app(gateway, server_cfg, keys), host=server_cfg.host, port=server_cfg.port,
        log_level=server_cfg.log_level, timeout_graceful_shutdown=5, lifespan="on",
        http=JsonErrorH11Protocol, h11_max_incomplete_event_size=PARSER_BUFFER_BYTES,
    )


def run_gateway(urls: list[str], server_cfg: ServerConfig, router_cfg: RouterConfig) -> None:
    """Serve the gateway until interrupted (blocking); ConfigError on a bad --api-key-file."""
    keys = ApiKeys.from_config(server_cfg)
    gateway = Gateway(urls, router_cfg, rank_key=keys.any_key)
    logger.info(
        "gateway_start host=%s port=%d policy=%s ranks=%s", server_cfg.host, server_cfg.port, router_cfg.policy,
        ",".join(urls),
    )
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(_uvicorn_config(gateway, server_cfg, keys)).run()
    logger.info("gateway_stop")


class GatewayThread(UvicornThread):
    """The gateway in a background thread: `start()` returns once it listens."""

    def __init__(self, urls: list[str], router_cfg: RouterConfig, server_cfg: ServerConfig | None = None) -> None:
        self.server_cfg = cfg = server_cfg or ServerConfig(port=0)
        keys = ApiKeys.from_config(cfg)
        self.gateway = Gateway(urls, router_cfg, rank_key=keys.any_key)
        super().__init__(_uvicorn_config(self.gateway, cfg, keys), cfg.host, cfg.port, "kvstrata-gateway")
