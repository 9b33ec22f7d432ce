"""Request size and shape limits, checked before a body reaches JSON parsing or validation.

- a body over `--max-request-body-bytes` (by Content-Length, or counted while it streams in): 413;
- JSON nested deeper than `--max-json-depth`: 400 (deep nesting costs parsers stack and time and
  no OpenAI request needs more than a few levels);
- a string escaping half a surrogate pair (`"\\ud800"`), which no UTF-8 text can hold: 400.
- request headers over `MAX_HEADER_BYTES` in all: 431 (beyond `PARSER_BUFFER_BYTES` the HTTP
  parser itself answers 431, see http_protocol.py);
- a body that stops arriving (a Content-Length longer than what is sent) for
  `--request-body-timeout` seconds: 408.
All answers are OpenAI-style JSON errors.
"""
from __future__ import annotations

import asyncio
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvstrata.serving.errors import error_response

MAX_HEADER_BYTES = 32 * 1024  # names and values together; browsers send a few KiB
PARSER_BUFFER_BYTES = 4 * MAX_HEADER_BYTES  # uvicorn/h11 buffer a request line + headers up to this
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)  # a JSON string, escapes included
_BRACKET = re.compile(rb"[\[\]{}]")
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_ESCAPE = re.compile(rb"\\(?:u[dD][89a-fA-F][0-9a-fA-F]{2}|.)", re.DOTALL)  # `\\` is one escape


def json_depth(body: bytes) -> int:
    """The deepest nesting of arrays and objects in `body` (brackets inside strings ignored)."""
    depth = deepest = 0
    for match in _BRACKET.finditer(_STRING.sub(b'""', body)):
        if match.group() in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def has_lone_surrogate(body: bytes) -> bool:
    """Whether a JSON text escapes half a UTF-16 surrogate pair (`"\\ud800"`): such a string cannot
    be encoded as UTF-8, so tokenizers and hashes would fail on it."""
    if not _SURROGATE.search(body):
        return False
    high_ends_at: int | None = None  # where an unpaired high surrogate escape ended
    for m in _ESCAPE.finditer(body):
        token = m.group()
        if len(token) == 6 and token[3:4] in b"89abAB":  # high: a low must follow at once
            if high_ends_at is not None:
                return True
            high_ends_at = m.end()
        elif len(token) == 6:  # low: only right after a high
            if high_ends_at != m.start():
                return True
            high_ends_at = None
        elif high_ends_at is not None:
            return True
    return high_ends_at is not None


class _TooLarge(Exception):
    pass


class _Stalled(Exception):
    pass


class RequestLimitsMiddleware:
    """Read the body once (bounded), check it, then hand it to the app as if it came off the wire."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, max_json_depth: int, body_timeout_s: float = 5.0) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth
        self.body_timeout_s = body_timeout_s

    def _too_large(self) -> object:
        return error_response(
            413, f"the request body is larger than {self.max_body_bytes} bytes; send less "
                 "(the server's --max-request-body-bytes)", code="request_too_large",
        )

    async def _read(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), self.body_timeout_s)
            except asyncio.TimeoutError:
                raise _Stalled() from None
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _TooLarge()
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if sum(len(k) + len(v) for k, v in scope.get("headers", ())) > MAX_HEADER_BYTES:
            response = error_response(
                431, f"the request headers are larger than {MAX_HEADER_BYTES} bytes in all; send fewer or shorter ones",
                code="headers_too_large",
            )
            await response(scope, receive, send)
            return
        if scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers", ())).get(b"content-length")
        try:
            if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
                raise _TooLarge()
            body = await self._read(receive)
        except _TooLarge:
            await self._too_large()(scope, receive, send)  # type: ignore[operator]
            return
        except _Stalled:
            response = error_response(
                408, f"the request body stopped arriving for {self.body_timeout_s:g} s before its Content-Length "
                     "was reached; send the whole body (the server's --request-body-timeout)", code="request_timeout",
            )
            await response(scope, receive, send)
            return
        if json_depth(body) > self.max_json_depth:
            response = error_response(
                400, f"the request body nests JSON deeper than {self.max_json_depth} levels; flatten it",
                code="json_too_deep",
            )
            await response(scope, receive, send)
            return
        if has_lone_surrogate(body):
            response = error_response(
                400, "the request body has an unpaired UTF-16 surrogate escape (like \\ud800); send valid Unicode",
                code="invalid_unicode",
            )
            await response(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: disconnects, as the app expects

        await self.app(scope, replay, send)
