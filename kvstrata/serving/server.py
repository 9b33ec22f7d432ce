"""Start the HTTP server at once and load the engine behind it.

`run_server` binds the port before the weights load, so `GET /health` answers 503 {"status":
"loading"} while a background thread builds the engine, 200 once it is ready, and 503 {"status":
"dead"} if loading failed or the engine thread died later; then the process exits 1 so a
supervisor restarts it. SIGTERM drains (serving/shutdown.py) and exits 0. `ServerThread` runs the
same app in a thread of the current process (tests, notebooks).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

import uvicorn

from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.config_server import ServerConfig
from kvstrata.serving.h11_errors import protocol_settings
from kvstrata.serving.openai_api import build_app
from kvstrata.serving.shutdown import DrainingServer, drain_then_stop, watch_engine
from kvstrata.serving.state import ServerState
from kvstrata.serving.uvicorn_thread import UvicornThread

if TYPE_CHECKING:
    from kvstrata.engine.async_engine import AsyncEngine

logger = logging.getLogger(__name__)


def load_engine_in_background(state: ServerState, loader: Callable[[], AsyncEngine]) -> threading.Thread:
    """Run `loader` in a daemon thread; publish its engine, or its error, on `state`."""

    def load() -> None:
        started = time.monotonic()
        try:
            engine = loader()
        except BaseException as exc:  # noqa: BLE001 - reported through /health and every route
            logger.exception("engine_load_failed error=%r", exc)
            state.load_error = f"{type(exc).__name__}: {exc}"
            return
        state.publish(engine)
        logger.info(
            "engine_ready model=%s max_model_len=%d load_s=%.1f",
            engine.served_model_name, engine.max_model_len, time.monotonic() - started,
        )

    thread = threading.Thread(target=load, name="kvstrata-engine-loader", daemon=True)
    thread.start()
    return thread


def _uvicorn_config(state: ServerState) -> uvicorn.Config:
    cfg = state.server_cfg
    return uvicorn.Config(
        build_app(state), host=cfg.host, port=cfg.port, log_level=cfg.log_level,
        timeout_graceful_shutdown=1, lifespan="off",  # shutdown.py drains before this
        **protocol_settings(),
    )


def run_server(
    model_cfg: ModelConfig, cache_cfg: CacheConfig, sched_cfg: SchedulerConfig, server_cfg: ServerConfig
) -> int:
    """Serve until SIGTERM/SIGINT (0, after draining) or the engine's death (1); the engine loads
    in the background. Returns the exit code."""

    def load() -> AsyncEngine:
        from kvstrata.engine.async_engine import AsyncEngine  # heavy (torch): imported off the server's path

        engine = AsyncEngine.from_config(model_cfg, cache_cfg, sched_cfg)
        tokens = server_cfg.warmup_tokens
        if tokens is None or tokens > 0:  # before the engine is published: /health says ready only after it
            budget = sched_cfg.max_num_batched_tokens
            engine.call_blocking(lambda e: e.warm_up(tokens if tokens is not None else e.default_warmup_tokens(budget)))
        return engine

    logging.basicConfig(
        level=server_cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    state = ServerState(model_cfg, cache_cfg, sched_cfg, server_cfg)
    load_engine_in_background(state, load)
    logger.info("server_start host=%s port=%d model=%s", server_cfg.host, server_cfg.port, model_cfg.model)
    server = DrainingServer(_uvicorn_config(state), state)
    died = threading.Event()

    def on_death() -> None:
        died.set()
        server.should_exit = True

    watch_engine(state, on_death)
    try:
        server.run()
    except KeyboardInterrupt:  # a signal uvicorn re-raises after its own shutdown
        pass
    finally:
        if state.engine is not None:  # drains in-flight L2 -> L3 writes when a store is configured
            state.engine.shutdown(timeout=max(server_cfg.shutdown_timeout, 1.0))
        logger.info("server_stop exit_code=%d", 1 if died.is_set() else 0)
    return 1 if died.is_set() else 0


class ServerThread(UvicornThread):
    """The kvstrata app in a background thread (tests, notebooks)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        cfg = state.server_cfg
        super().__init__(_uvicorn_config(state), cfg.host, cfg.port, "kvstrata-uvicorn")

    def drain(self, timeout_s: float) -> threading.Thread:
        """What SIGTERM does in `run_server`: refuse new requests, let running ones finish, stop."""

        def stop() -> None:
            self._server.should_exit = True

        return drain_then_stop(self.state.lifecycle, stop, timeout_s)
