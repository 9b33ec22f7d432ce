"""The `x-kvstrata-cache` header (hit, miss or bypass) that every completion response carries, and
the middleware that marks error answers `bypass`. Apart from `service.py`, so the gateway, which
puts the same mark on its own errors, imports no rank-side module."""
from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CACHE_HEADER = "x-kvstrata-cache"


class CacheHeaderOnErrors:
    """ASGI middleware: an error answer (4xx/5xx) of a completion route that set no cache header
    (validation, auth, limits, draining, a failed request) gets `x-kvstrata-cache: bypass`, so
    every response of those routes says what the cache did."""

    ROUTES = frozenset({"/v1/completions", "/v1/chat/completions"})

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.ROUTES:
            await self.app(scope, receive, send)
            return

        async def send_marked(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                headers = list(message.get("headers", []))
                if not any(name.lower() == CACHE_HEADER.encode() for name, _ in headers):
                    message = {**message, "headers": [*headers, (CACHE_HEADER.encode(), b"bypass")]}
            await send(message)

        await self.app(scope, receive, send_marked)
