"""Request size and shape limits, checked before a body reaches JSON parsing or validation.

- a body over `--max-request-body-bytes` (by Content-Length, or counted while it streams in): 413;
- JSON nested deeper than `--max-json-depth`: 400 (deep nesting costs parsers stack and time and
  no OpenAI request needs more than a few levels);
- a string escaping half a surrogate pair (`"\\ud800"`) or holding its UTF-8 bytes, which no UTF-8
  text can hold: 400;
- a NaN or Infinity literal (Python's json reads them, JSON has none, no reply could echo one): 400;
- request headers over `MAX_HEADER_BYTES` in all: 431 (beyond `PARSER_BUFFER_BYTES` the HTTP
  parser itself answers 431, see h11_errors.py);
- a body that stops arriving (a Content-Length longer than what is sent) for
  `--request-body-timeout` seconds: 408.
All answers are OpenAI-style JSON errors. The body checks (body_scan.py) are linear in the body;
a body over `INLINE_CHECK_BYTES` is checked in a worker thread.
"""
from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvstrata.serving.body_scan import non_finite_key, scan_body
from kvstrata.serving.errors import error_response

MAX_HEADER_BYTES = 32 * 1024  # names and values together; browsers send a few KiB
PARSER_BUFFER_BYTES = 4 * MAX_HEADER_BYTES  # uvicorn/h11 buffer a request line + headers up to this
INLINE_CHECK_BYTES = 64 * 1024  # larger bodies are checked in a worker thread, off the event loop


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

    def _check(self, body: bytes) -> object | None:
        """The error answer for a body that fails a check (body_scan.py: each linear), or None."""
        scan = scan_body(body)
        if scan.depth > self.max_json_depth:
            return error_response(
                400, f"the request body nests JSON deeper than {self.max_json_depth} levels; flatten it",
                code="json_too_deep",
            )
        if scan.non_finite:
            return error_response(
                400, "the request body has a NaN or Infinity literal, which JSON does not allow; send a number",
                param=non_finite_key(body), code="invalid_value",
            )
        if scan.lone_surrogate:
            return error_response(
                400, "the request body has an unpaired UTF-16 surrogate (an escape like \\ud800, or its UTF-8 "
                     "bytes); send valid Unicode", code="invalid_unicode",
            )
        return None

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
        if len(body) <= INLINE_CHECK_BYTES:
            refusal = self._check(body)
        else:  # the scan holds the GIL, but the event loop still gets its turns between the thread's slices
            refusal = await asyncio.to_thread(self._check, body)
        if refusal is not None:
            await refusal(scope, receive, send)  # type: ignore[operator]
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: disconnects, as the app expects

        await self.app(scope, replay, send)

