"""Async streaming chat client for any OpenAI-compatible server (kvstrata, vLLM, llama-server, ...).

One `ChatClient.chat(messages)` call = one streamed `/v1/chat/completions` request with
`temperature 0` and `stream_options.include_usage`, measured from the moment the request is sent:
- TTFT: the first SSE chunk whose `choices[0].delta.content` is non-empty (role-only and empty
  chunks do not count);
- e2e: until the stream ends (`data: [DONE]` or the connection closes);
- usage: `prompt_tokens`, `completion_tokens`, `prompt_tokens_details.cached_tokens` from the final
  usage chunk; any of them is None when the peer leaves it out.
Failures (connection errors, HTTP status >= 400, an `error` object in the stream) never raise:
they come back as a `ChatResult` with `error` set, so one bad request cannot stop a run.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class ChatResult:
    text: str  # the reply content, the concatenated deltas
    t_sent: float  # time.perf_counter() when the request was sent
    t_done: float  # time.perf_counter() when the stream ended
    ttft_s: float | None  # None when no content token arrived
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens; None if not reported
    content_chunks: int  # SSE chunks that carried content (a token count when usage is missing)
    error: str | None = None
    chunk_times: tuple[float, ...] = ()  # time.perf_counter() at each content chunk (decode rates)
    rank: int | None = None  # the kvstrata gateway's `x-kvstrata-rank` (which rank answered), else None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def e2e_s(self) -> float:
        return self.t_done - self.t_sent


@dataclass(frozen=True)
class RequestRecord:
    """One request a workload driver sent (which session, which turn, the messages) and its result."""

    session_id: int
    agent_id: int
    turn: int  # 0 = the session's first request
    turn_kind: str  # "user" or "tool_result"
    messages: list[dict[str, str]]  # exactly what was sent
    result: ChatResult


def chat_completions_url(url: str) -> str:
    """`http://host:port`, `.../v1` or the full endpoint -> the chat completions endpoint."""
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


class ChatClient:
    """Streams chat completions over one pooled `httpx.AsyncClient`; use as an async context."""

    def __init__(
        self,
        url: str,
        model: str,
        max_tokens: int,
        max_connections: int = 64,
        timeout_s: float = 600.0,
        api_key: str | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        self.endpoint = chat_completions_url(url)
        self.model = model
        self.max_tokens = max_tokens
        self.extra_body = dict(extra_body or {})  # merged into every request body (e.g. ignore_eos)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=30.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            headers=headers,
        )

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def payload(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.extra_body,
        }

    async def chat(self, messages: list[dict[str, str]], extra: dict[str, Any] | None = None) -> ChatResult:
        """One streamed request; `extra` fields (e.g. prompt_cache_key) are merged into its body."""
        stream = _StreamState(time.perf_counter())
        try:
            body = {**self.payload(messages), **(extra or {})}
            async with self._http.stream("POST", self.endpoint, json=body) as resp:
                rank = resp.headers.get("x-kvstrata-rank")
                stream.rank = int(rank) if rank is not None and rank.isdigit() else None
                if resp.status_code >= 400:
                    body = (await resp.aread()).decode("utf-8", "replace")
                    stream.error = f"HTTP {resp.status_code}: {body[:300]}"
                else:
                    async for line in resp.aiter_lines():
                        if stream.feed_line(line):
                            break
        except (httpx.HTTPError, OSError) as exc:
            stream.error = f"{type(exc).__name__}: {exc}"
        return stream.result(time.perf_counter())


class _StreamState:
    """Folds SSE lines into a ChatResult."""

    def __init__(self, t_sent: float) -> None:
        self.t_sent = t_sent
        self.parts: list[str] = []
        self.ttft_s: float | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.content_chunks = 0
        self.chunk_times: list[float] = []
        self.error: str | None = None
        self.rank: int | None = None

    def feed_line(self, line: str) -> bool:
        """Consume one SSE line; True when the stream is over."""
        if not line.startswith("data:"):
            return False  # blank separators, comments, `event:` lines
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return True
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            self.error = f"bad SSE data: {data[:200]}"
            return True
        if chunk.get("error"):
            self.error = f"stream error: {json.dumps(chunk['error'])[:300]}"
            return True
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                now = time.perf_counter()
                if self.ttft_s is None:
                    self.ttft_s = now - self.t_sent
                self.chunk_times.append(now)
                self.parts.append(content)
                self.content_chunks += 1
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return False

    def result(self, t_done: float) -> ChatResult:
        details = self.usage.get("prompt_tokens_details") or {}
        return ChatResult(
            text="".join(self.parts),
            t_sent=self.t_sent,
            t_done=t_done,
            ttft_s=self.ttft_s,
            finish_reason=self.finish_reason,
            prompt_tokens=self.usage.get("prompt_tokens"),
            completion_tokens=self.usage.get("completion_tokens"),
            cached_tokens=details.get("cached_tokens"),
            content_chunks=self.content_chunks,
            error=self.error,
            chunk_times=tuple(self.chunk_times),
            rank=self.rank,
        )
