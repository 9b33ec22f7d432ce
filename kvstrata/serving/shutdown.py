"""Lifecycle: graceful drain on SIGTERM/SIGINT, and an exit when the engine dies.

Drain: the first signal sets `Lifecycle.draining`: new requests get 503 (code `shutting_down`),
`/health` answers 503 {"status": "draining"} so a balancer stops sending, and the requests already
in flight (streams included) run to the end for up to `--shutdown-timeout` seconds. Then uvicorn
stops; `run_server` closes the engine, which flushes to the L3 store every L1/L2 page it lacks and
drains the writes (`kv/store_flush.py`, bounded by the same timeout), and exits 0. A second
signal stops at once.

Watchdog: when the engine thread dies (or the model failed to load), `/health` says 503 "dead" and
the process exits 1 shortly after, so a supervisor restarts it.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType
from typing import Callable, Protocol

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from kvstrata.config_server import ServerConfig
from kvstrata.serving.errors import error_response

logger = logging.getLogger(__name__)
ALWAYS_OPEN = "/health"


class Lifecycle:
    """Counts HTTP requests in flight and says whether the server is draining."""

    def __init__(self) -> None:
        self.draining = False
        self._inflight = 0
        self._idle = threading.Condition()

    @property
    def inflight(self) -> int:
        return self._inflight

    def enter(self) -> None:
        with self._idle:
            self._inflight += 1

    def leave(self) -> None:
        with self._idle:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.notify_all()

    def begin_drain(self) -> None:
        self.draining = True

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no request is in flight (True) or `timeout_s` passed (False)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout_s)


class LifecycleMiddleware:
    """503 while draining (except /health); otherwise count the request while it runs."""

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle) -> None:
        self.app = app
        self.lifecycle = lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == ALWAYS_OPEN:
            await self.app(scope, receive, send)
            return
        if self.lifecycle.draining:
            response = error_response(
                503, "the server is shutting down; retry on another instance", "server_error",
                code="shutting_down", headers={"Connection": "close", "Retry-After": "1"},
            )
            await response(scope, receive, send)
            return
        self.lifecycle.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.lifecycle.leave()


class WatchedState(Protocol):
    """What the drain and the watchdog read of the server: serving/state.py's `ServerState` is one (it
    holds a `Lifecycle`, so this module names a protocol instead of importing it)."""

    lifecycle: Lifecycle
    server_cfg: ServerConfig
    load_error: str | None

    @property
    def status(self) -> str: ...


def drain_then_stop(lifecycle: Lifecycle, stop: Callable[[], None], timeout_s: float) -> threading.Thread:
    """Start draining now; in a thread, wait for in-flight requests (bounded), then `stop()`."""
    lifecycle.begin_drain()
    logger.info("shutdown_drain_start inflight=%d timeout_s=%.1f", lifecycle.inflight, timeout_s)

    def run() -> None:
        started = time.monotonic()
        idle = lifecycle.wait_idle(timeout_s)
        logger.info(
            "shutdown_drain_end idle=%s inflight=%d waited_s=%.1f", idle, lifecycle.inflight,
            time.monotonic() - started,
        )
        stop()

    thread = threading.Thread(target=run, name="kvstrata-drain", daemon=True)
    thread.start()
    return thread


class DrainingServer(uvicorn.Server):
    """uvicorn whose first SIGTERM/SIGINT drains instead of cutting requests; a second one forces."""

    def __init__(self, config: uvicorn.Config, state: WatchedState) -> None:
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        lifecycle = self.state.lifecycle
        if lifecycle.draining:
            logger.warning("shutdown_forced signal=%s", signal.Signals(sig).name)
            self.should_exit = self.force_exit = True
            return
        logger.info("shutdown_signal signal=%s", signal.Signals(sig).name)
        drain_then_stop(lifecycle, self._stop, self.state.server_cfg.shutdown_timeout)

    def _stop(self) -> None:
        self.should_exit = True


def watch_engine(state: WatchedState, stop: Callable[[], None], interval_s: float = 0.5) -> threading.Thread:
    """Call `stop()` once the engine is dead (load failure or thread death); the caller exits 1."""

    def run() -> None:
        while not state.lifecycle.draining:
            if state.status == "dead":
                logger.error("engine_dead_exit error=%s", state.load_error or "the engine thread died")
                time.sleep(interval_s)  # let /health say 'dead' to whoever is polling
                stop()
                return
            time.sleep(interval_s)

    thread = threading.Thread(target=run, name="kvstrata-watchdog", daemon=True)
    thread.start()
    return thread
