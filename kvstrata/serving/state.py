"""What the HTTP layer knows about the process: the configs and the engine once it has loaded."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.config_server import ServerConfig
from kvstrata.serving.auth import ApiKeys
from kvstrata.serving.errors import APIError
from kvstrata.metrics.rank import LatencyTargets, Metrics
from kvstrata.serving.request_log import RequestLog
from kvstrata.serving.response_cache.service import ResponseCacheService
from kvstrata.serving.shutdown import Lifecycle

if TYPE_CHECKING:
    from kvstrata.engine.async_engine import AsyncEngine


@dataclass
class ServerState:
    """Shared by the routes. `engine` is None while loading; `load_error` is set if loading failed.

    The loader thread writes `engine` or `load_error` exactly once; routes only read them.
    """

    model_cfg: ModelConfig
    cache_cfg: CacheConfig
    sched_cfg: SchedulerConfig
    server_cfg: ServerConfig
    engine: AsyncEngine | None = None
    load_error: str | None = None
    metrics: Metrics = field(init=False)
    response_cache: ResponseCacheService = field(init=False)
    request_log: RequestLog | None = field(init=False)
    api_keys: ApiKeys = field(init=False)
    lifecycle: Lifecycle = field(init=False)

    def __post_init__(self) -> None:
        self.api_keys = ApiKeys.from_config(self.server_cfg)  # ValueError on a bad --api-key-file
        self.lifecycle = Lifecycle()
        sched = self.sched_cfg
        self.metrics = Metrics(log_request_stats=self.server_cfg.enable_log_request_stats,
                               targets=LatencyTargets(sched.ttft_target_ms / 1000.0, sched.tpot_target_ms / 1000.0))
        # raises ValueError on a bad --response-cache-* flag: refused at start, before the port binds
        tenants = set(self.api_keys.tenants.values()) if self.api_keys.enabled else {None}
        self.response_cache = ResponseCacheService(self.server_cfg, self.metrics, tenants)
        self.request_log = (
            RequestLog(self.server_cfg.log_requests, self.server_cfg.log_requests_redact)
            if self.server_cfg.log_requests else None
        )

    def publish(self, engine: AsyncEngine) -> None:
        """Make a loaded engine visible to the routes (metrics observe it from its first request)."""
        self.metrics.bind(engine)
        self.engine = engine

    @property
    def status(self) -> str:
        """'loading' | 'ready' | 'draining' (shutting down) | 'dead' (failed to load, or the engine thread died)."""
        if self.load_error is not None:
            return "dead"
        if self.engine is None:
            return "loading"
        if not self.engine.healthy:
            return "dead"
        return "draining" if self.lifecycle.draining else "ready"

    def ready_engine(self) -> AsyncEngine:
        """The engine, or a 503 APIError that says why there is none."""
        if self.load_error is not None:
            raise APIError(
                503, f"the model failed to load ({self.load_error}); fix the cause and restart the server",
                "server_error", code="engine_dead",
            )
        engine = self.engine
        if engine is None:
            raise APIError(
                503, "the model is still loading; retry when GET /health returns 200",
                "server_error", code="model_loading",
            )
        if not engine.healthy:
            raise APIError(
                503, "the engine has stopped; check the server log and restart the server",
                "server_error", code="engine_dead",
            )
        return engine
