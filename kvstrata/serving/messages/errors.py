"""Errors on /v1/messages in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.

Every layer of the server (auth, body limits, draining, validation, the engine) answers errors in
OpenAI's shape; `AnthropicErrors` rewrites those of the Messages routes on their way out, so the
Anthropic SDK and Claude Code read them as Anthropic's own. Statuses are Anthropic's: load shedding
(a full queue's 429 `overloaded`, a draining server's 503) is 529 `overloaded_error`, which its
clients retry with backoff.

| status      | error.type            |
|-------------|-----------------------|
| 400, 405, 422 | invalid_request_error |
| 401         | authentication_error  |
| 403         | permission_error      |
| 404         | not_found_error       |
| 408, 504    | timeout_error         |
| 413         | request_too_large     |
| 429         | rate_limit_error      |
| 529         | overloaded_error      |
| 5xx         | api_error             |
"""
from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

PATH_PREFIX = "/v1/messages"
OVERLOADED = 529
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error", 413: "request_too_large",
          422: "invalid_request_error", 429: "rate_limit_error", 504: "timeout_error", OVERLOADED: "overloaded_error"}


def anthropic_error(status: int, message: str, code: str | int | None = None) -> tuple[int, dict[str, Any]]:
    """(status, body) of an error as Anthropic reports it."""
    if (status == 429 and code == "overloaded") or status == 503:
        status = OVERLOADED
    kind = _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return status, {"type": "error", "error": {"type": kind, "message": message}}


def rewrite(status: int, body: bytes) -> tuple[int, bytes]:
    """An OpenAI-style error body as Anthropic's; a body of another shape is wrapped as its message."""
    try:
        parsed = json.loads(body)
        err = parsed["error"]
        message, code = str(err["message"]), err.get("code")
    except (ValueError, KeyError, TypeError):
        message, code = body.decode("utf-8", "replace") or f"HTTP {status}", None
    status, out = anthropic_error(status, message, code)
    return status, json.dumps(out, ensure_ascii=False).encode()


class AnthropicErrors:
    """Rewrite the error responses of the Messages routes (status >= 400) into Anthropic's shape."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith(PATH_PREFIX):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def send_rewritten(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until the whole (small) error body is here
                return
            if start is None:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            status, body = rewrite(start["status"], b"".join(chunks))
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in (b"content-length",
                                                                                           b"content-type")]
            headers += [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, send_rewritten)
