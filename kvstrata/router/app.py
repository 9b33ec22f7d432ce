"""The gateway's HTTP face: OpenAI routes proxied to a rank (chat, completions, responses), the
tokenizer's routes (/tokenize, /detokenize) sent to any ready rank, plus /health, /metrics,
/dashboard, /flush_cache.

It checks API keys itself (the rank's middleware and key sources: `--api-key`, `--api-key-file`,
$KVSTRATA_API_KEY; the dashboard cookie too) and forwards the client's `Authorization` header, so
the rank puts the request in that key's tenant. Its own calls to ranks (info, /metrics, flush)
carry one of its keys: give the ranks the same keys. `/metrics` merges the ranks' series (each
with a `rank` label), which is what the `/dashboard` page sums over.

`run_gateway` serves until SIGTERM/SIGINT (`kvstrata route`, `kvstrata serve --dp-size N`): the
first signal makes new requests 503 `shutting_down` while those in flight finish, runs
`stop_backends` (the launcher stops its ranks: they drain too) or else waits up to
--shutdown-timeout, then exits; a second signal stops at once. It never re-raises the signal, so
the caller's cleanup always runs. `GatewayThread` runs it in a thread of this process (tests).
"""
from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
from types import FrameType
from typing import Any, AsyncIterator, Callable

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from kvstrata.config_server import RouterConfig, ServerConfig
from kvstrata.metrics import CONTENT_TYPE
from kvstrata.router.gateway import Gateway, send_headers
from kvstrata.router.passthrough import any_rank
from kvstrata.serving.auth import ApiKeys, AuthMiddleware, request_tenant
from kvstrata.serving.dashboard import install_dashboard_route
from kvstrata.serving.errors import install_error_handlers
from kvstrata.serving.h11_errors import protocol_settings
from kvstrata.serving.limits import RequestLimitsMiddleware
from kvstrata.serving.messages.errors import AnthropicErrors
from kvstrata.serving.response_cache.header import CacheHeaderOnErrors
from kvstrata.serving.shutdown import Lifecycle, LifecycleMiddleware
from kvstrata.serving.uvicorn_thread import UvicornThread
from kvstrata.serving.worker_info import MODEL_INFO_PATHS, SERVER_INFO_PATHS

logger = logging.getLogger(__name__)
# sent on to a rank
PROXIED_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens")
# every rank has the same tokenizer: any ready one answers, nothing is routed or counted as load
TOKENIZER_PATHS = ("/tokenize", "/detokenize")
TOKENIZER_TIMEOUT_S = 60.0  # a prompt near the body limit takes a rank seconds to tokenize


def build_gateway_app(
    gateway: Gateway, server_cfg: ServerConfig, keys: ApiKeys, lifecycle: Lifecycle | None = None
) -> FastAPI:
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
    app.add_middleware(LifecycleMiddleware, lifecycle=lifecycle or Lifecycle())  # 503 once draining
    app.add_middleware(AnthropicErrors)  # the gateway's own errors on /v1/messages in Anthropic's shape
    install_dashboard_route(app)  # GET /dashboard, charts of the merged /metrics below

    async def proxied(request: Request) -> Response:
        started = time.perf_counter()
        return await gateway.proxy(request.url.path, await request.body(), dict(request.headers), started,
                                   request_tenant(request))

    for path in PROXIED_PATHS:
        app.add_api_route(path, proxied, methods=["POST"], name=f"proxy{path}")

    async def tokenizer(request: Request) -> Response:
        send = send_headers(dict(request.headers))
        return await any_rank(gateway.pool, gateway.client, "POST", request.url.path, send, await request.body(),
                              TOKENIZER_TIMEOUT_S)

    for path in TOKENIZER_PATHS:
        app.add_api_route(path, tokenizer, methods=["POST"], name=f"tokenizer{path}")

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return await gateway.get_json("/v1/models", dict(request.headers))

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> Response:
        return await gateway.get_json(f"/v1/models/{model_id}", dict(request.headers))

    async def worker_info(request: Request) -> Response:
        """A rank's /server_info or /model_info; dp_size is the gateway's rank count (smg --dp-aware)."""
        resp = await gateway.get_json(request.url.path, dict(request.headers))
        if request.url.path in SERVER_INFO_PATHS and resp.status_code == 200:
            return JSONResponse({**json.loads(resp.body), "dp_size": len(gateway.pool.workers)})
        return resp

    for path in (*SERVER_INFO_PATHS, *MODEL_INFO_PATHS):
        app.add_api_route(path, worker_info, methods=["GET"], name=f"worker_info{path}")

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
            # whether prompts are matched against the ranks' caches yet (the tokenizer loads after a rank is up)
            "prompt_matching": gateway.prompt_matching,
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


def _uvicorn_config(
    gateway: Gateway, server_cfg: ServerConfig, keys: ApiKeys, lifecycle: Lifecycle | None = None
) -> uvicorn.Config:
    return uvicorn.Config(
        build_gateway_app(gateway, server_cfg, keys, lifecycle), host=server_cfg.host, port=server_cfg.port,
        log_level=server_cfg.log_level, timeout_graceful_shutdown=5, lifespan="on",
        **protocol_settings(),
    )


class _DrainingGateway(uvicorn.Server):
    """First SIGTERM/SIGINT: drain (new requests 503), run `stop_backends` in a thread, then stop.
    A second one: `force_backends`, stop at once. The signal is not re-raised after shutdown."""

    def __init__(
        self, config: uvicorn.Config, lifecycle: Lifecycle, timeout_s: float,
        stop_backends: Callable[[], Any] | None, force_backends: Callable[[], None] | None,
    ) -> None:
        super().__init__(config)
        self.lifecycle, self.timeout_s = lifecycle, timeout_s
        self.stop_backends, self.force_backends = stop_backends, force_backends

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.lifecycle.draining:
            logger.warning("gateway_shutdown_forced signal=%s", signal.Signals(sig).name)
            if self.force_backends is not None:
                self.force_backends()
            self.should_exit = self.force_exit = True
            return
        logger.info("gateway_shutdown_signal signal=%s inflight=%d", signal.Signals(sig).name, self.lifecycle.inflight)
        self.lifecycle.begin_drain()
        threading.Thread(target=self._drain, name="kvstrata-gateway-drain", daemon=True).start()

    def _drain(self) -> None:
        if self.stop_backends is not None:
            self.stop_backends()  # ranks finish the requests they hold, so ours finish too
        self.lifecycle.wait_idle(self.timeout_s)
        self.should_exit = True


def run_gateway(
    urls: list[str], server_cfg: ServerConfig, router_cfg: RouterConfig,
    stop_backends: Callable[[], Any] | None = None, force_backends: Callable[[], None] | None = None,
) -> None:
    """Serve the gateway until SIGTERM/SIGINT and a drain (blocking); ConfigError on a bad
    --api-key-file."""
    keys = ApiKeys.from_config(server_cfg)
    gateway = Gateway(urls, router_cfg, rank_key=keys.any_key)
    lifecycle = Lifecycle()
    logger.info(
        "gateway_start host=%s port=%d policy=%s ranks=%s", server_cfg.host, server_cfg.port, router_cfg.policy,
        ",".join(urls),
    )
    server = _DrainingGateway(_uvicorn_config(gateway, server_cfg, keys, lifecycle), lifecycle,
                              server_cfg.shutdown_timeout, stop_backends, force_backends)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    logger.info("gateway_stop")


class GatewayThread(UvicornThread):
    """The gateway in a background thread: `start()` returns once it listens."""

    def __init__(self, urls: list[str], router_cfg: RouterConfig, server_cfg: ServerConfig | None = None) -> None:
        self.server_cfg = cfg = server_cfg or ServerConfig(port=0)
        keys = ApiKeys.from_config(cfg)
        self.gateway = Gateway(urls, router_cfg, rank_key=keys.any_key)
        super().__init__(_uvicorn_config(self.gateway, cfg, keys), cfg.host, cfg.port, "kvstrata-gateway")
