"""A tiny OpenAI-style streaming peer for the bench tests.

It is a test double for a real server (kvstrata, vLLM, llama-server): a starlette app under
uvicorn on a free loopback port that streams SSE chunks the way OpenAI's API does. What it does is
chosen by the request's `model`:
- "ok": role chunk, a pause of TTFT_DELAY_S, the reply in CHUNKS content chunks, finish_reason
  "length", then (if asked) a usage chunk with `prompt_tokens_details.cached_tokens`;
- "no-cache-field": the same but its usage has no `prompt_tokens_details` (like some peers);
- "fail": HTTP 500 with an OpenAI-style error body.
`/v1/completions` (the repeat workload's) answers one JSON body, after TTFT_DELAY_S; with
`response_cache` on it answers a body it saw before at once, with `x-kvstrata-cache: hit`, and
`on_completion(body, header)` hears what it answered.
Every request body is kept in `FakePeer.requests`; `max_in_flight` is the most streams open at once.
With `gather` = N, a chat stream of more than one token holds its tokens until N streams are open
(or `gather_timeout_s` passed: a lone stream), so a client's concurrent streams surely meet.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

TTFT_DELAY_S = 0.05
CHUNKS = 4
CACHED_TOKENS = 7


def reply_for(messages: list[dict[str, str]]) -> str:
    """The double's deterministic reply: it names the turn it answers."""
    turn = sum(m["role"] == "user" for m in messages)
    return f"Answer to turn {turn} with some words."


@dataclass
class FakePeer:
    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    response_cache: bool = False
    on_completion: Callable[[dict[str, Any], str], None] | None = None  # (body, x-kvstrata-cache sent)
    gather: int = 1
    gather_timeout_s: float = 1.0

    def reset(self) -> None:
        self.requests.clear()
        self.in_flight = self.max_in_flight = 0
        self.gather = 1


def _chunk(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _app(peer: FakePeer) -> Starlette:
    async def chat(request: Request) -> Response:
        body = await request.json()
        peer.requests.append(body)
        if body["model"] == "fail":
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
        text = reply_for(body["messages"])
        usage: dict[str, Any] = {"prompt_tokens": 100, "completion_tokens": CHUNKS, "total_tokens": 100 + CHUNKS}
        if body["model"] == "ok":
            usage["prompt_tokens_details"] = {"cached_tokens": CACHED_TOKENS}
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": body["model"]}

        async def stream() -> AsyncIterator[str]:
            peer.in_flight += 1
            peer.max_in_flight = max(peer.max_in_flight, peer.in_flight)
            try:
                if peer.gather > 1 and body.get("max_tokens", 1) > 1:
                    deadline = time.monotonic() + peer.gather_timeout_s
                    while peer.in_flight < peer.gather and time.monotonic() < deadline:  # poll: the others arrive
                        await asyncio.sleep(0.002)
                async for piece in chunks():
                    yield piece
            finally:
                peer.in_flight -= 1

        async def chunks() -> AsyncIterator[str]:
            yield _chunk({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            await asyncio.sleep(TTFT_DELAY_S)
            step = -(-len(text) // CHUNKS)
            for i in range(CHUNKS):
                piece = text[i * step : (i + 1) * step]
                last = i == CHUNKS - 1
                choice = {"index": 0, "delta": {"content": piece}, "finish_reason": "length" if last else None}
                yield _chunk({**base, "choices": [choice]})
                await asyncio.sleep(0.005)
            if (body.get("stream_options") or {}).get("include_usage"):
                yield _chunk({**base, "choices": [], "usage": usage})
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def completions(request: Request) -> Response:
        body = await request.json()
        seen = body in peer.requests
        peer.requests.append(body)
        if body["model"] == "fail":
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
        hit = peer.response_cache and seen
        if not hit:
            await asyncio.sleep(TTFT_DELAY_S)
        headers = {"x-kvstrata-cache": "hit" if hit else "miss"} if peer.response_cache else {}
        if peer.on_completion is not None:
            peer.on_completion(body, headers.get("x-kvstrata-cache", ""))
        usage = {"prompt_tokens": 12, "completion_tokens": body["max_tokens"], "total_tokens": 12 + body["max_tokens"]}
        choice = {"index": 0, "text": " The Nile.", "finish_reason": "length"}
        return JSONResponse({"id": "cmpl-1", "object": "text_completion", "choices": [choice], "usage": usage},
                            headers=headers)

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/completions", completions, methods=["POST"])])


@contextlib.contextmanager
def serve_fake_peer() -> Iterator[FakePeer]:
    """Run the double under uvicorn on a free loopback port until the block exits."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    peer = FakePeer(url=f"http://127.0.0.1:{sock.getsockname()[1]}")
    server = uvicorn.Server(uvicorn.Config(_app(peer), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the fake OpenAI peer did not start")
            time.sleep(0.01)
        yield peer
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        sock.close()

