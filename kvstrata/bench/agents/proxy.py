"""A measuring reverse proxy between an agent CLI and the engine under test, on loopback.

Every engine is timed the same way, whatever it reports itself: for each POST the proxy records when the
request arrived, when the first generated content went back (the first SSE event of a content block or
an output delta: `content_block_start`/`_delta` for Anthropic's stream, `response.output_item.added`/
`*.delta` for the Responses API, a `choices` delta for chat; for a reply with no content, the end event:
its first token ended it), when it ended, its status, and the usage
the engine reported at the end (prompt tokens and cached tokens, in whichever API's spelling).
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

_CONTENT_EVENTS = ('"content_block_start"', '"content_block_delta"', '"response.output_item.added"',
                   '.delta"', '"choices": [{"index"', '"choices":[{"index"',
                   # a reply whose first token ends it has no content: its first token is the end
                   '"message_delta"', '"response.completed"', '"response.incomplete"', 'data: [DONE]')
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}


@dataclass
class Exchange:
    """One request through the proxy."""

    path: str
    started: float
    first_content: float | None = None
    ended: float | None = None
    status: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_content is None else self.first_content - self.started


def usage_of(event: dict[str, Any]) -> tuple[int | None, int | None]:
    """(prompt tokens, cached tokens) an SSE event or JSON body reports, in any of the three APIs."""
    usage = event.get("usage") or (event.get("response") or {}).get("usage") or \
        (event.get("message") or {}).get("usage")
    if not isinstance(usage, dict):
        return None, None
    if "cache_read_input_tokens" in usage:  # Anthropic: three disjoint parts
        read = int(usage.get("cache_read_input_tokens") or 0)
        return int(usage.get("input_tokens") or 0) + read + int(usage.get("cache_creation_input_tokens") or 0), read
    if "input_tokens" in usage:  # Responses
        return int(usage["input_tokens"]), int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
    if "prompt_tokens" in usage:  # chat / completions
        return int(usage["prompt_tokens"]), int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return None, None


@dataclass
class MeasuringProxy:
    """Serve on `port`, forward to `upstream`; `exchanges` fills as requests finish."""

    upstream: str
    port: int
    exchanges: list[Exchange] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._client = httpx.AsyncClient(base_url=self.upstream, timeout=httpx.Timeout(1800.0, connect=10.0))
        app = Starlette(routes=[Route("/{path:path}", self._forward, methods=["GET", "POST"])])
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MeasuringProxy:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the measuring proxy did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    async def _forward(self, request: Request) -> Response:
        ex = Exchange(request.url.path, time.monotonic())
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        upstream = self._client.build_request(request.method, request.url.path, params=request.query_params,
                                              headers=headers, content=await request.body())
        resp = await self._client.send(upstream, stream=True)
        ex.status = resp.status_code
        if request.method != "POST":
            ex.ended = time.monotonic()
            body = await resp.aread()
            return Response(body, resp.status_code, headers={"content-type": resp.headers.get("content-type", "")})
        return StreamingResponse(self._relay(resp, ex), resp.status_code,
                                 headers={"content-type": resp.headers.get("content-type", "application/json")})

    async def _relay(self, resp: httpx.Response, ex: Exchange) -> AsyncIterator[bytes]:
        tail = b""
        try:
            async for chunk in resp.aiter_raw():
                if ex.first_content is None and any(m.encode() in chunk for m in _CONTENT_EVENTS):
                    ex.first_content = time.monotonic()
                tail = (tail + chunk)[-65536:]
                self._read_usage(chunk, ex)
                yield chunk
            if ex.first_content is None and resp.status_code == 200:  # a whole JSON answer
                ex.first_content = time.monotonic()
            self._read_usage(tail, ex)
        finally:
            ex.ended = time.monotonic()
            await resp.aclose()
            self.exchanges.append(ex)

    @staticmethod
    def _read_usage(data: bytes, ex: Exchange) -> None:
        for line in data.decode("utf-8", "replace").splitlines():
            text = line[len("data: "):] if line.startswith("data: ") else line
            if '"usage"' not in text or not text.startswith("{"):
                continue
            try:
                prompt, cached = usage_of(json.loads(text))
            except ValueError:
                continue
            if prompt:
                ex.prompt_tokens, ex.cached_tokens = prompt, cached
