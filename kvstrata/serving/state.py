"""What the HTTP layer knows about the process: the configs and the engine once it has loaded."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig, ServerConfig
from kvstrata.serving.errors import APIError

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

    @property
    def status(self) -> str:
        """'loading' | 'ready' | 'dead' (failed to load, or the engine thread died)."""
        if self.load_error is not None:
            return "dead"
        if self.engine is None:
            return "loading"
        return "ready" if self.engine.healthy else "dead"

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
