"""`UvicornThread`: an app on a uvicorn server in a background thread of this process. A rank's
`ServerThread` (server.py) and the gateway's `GatewayThread` (router/app.py) build on it; it imports
neither app, so the gateway does not load the rank's routes."""
from __future__ import annotations

import threading
import time
from typing import TypeVar

import uvicorn

_T = TypeVar("_T", bound="UvicornThread")


class UvicornThread:
    """An app on a uvicorn server in a background thread: `start()` returns once it listens."""

    def __init__(self, config: uvicorn.Config, host: str, port: int, name: str) -> None:
        self._host, self._port = host, port
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=name, daemon=True)

    @property
    def base_url(self) -> str:
        """The address it listens on (port 0 in the config means a free port picked at start)."""
        port = self._port
        if self._server.started and self._server.servers:
            port = self._server.servers[0].sockets[0].getsockname()[1]
        return f"http://{self._host}:{port}"

    def start(self: _T, timeout_s: float = 10.0) -> _T:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self._thread.name} did not start on {self.base_url}; is the port free?")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
