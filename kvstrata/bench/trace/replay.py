"""Live replay of a trace slice against any OpenAI-compatible server.

Each request is sent at its trace time ((timestamp - first timestamp) / time_scale seconds after
the start; open loop, nothing waits for earlier replies) as one streamed `/v1/completions` call
whose `prompt` is the token ids of tokens.py (no chat template touches them), with
`max_tokens` = min(output_length, max_output_tokens) (at least 1), `temperature` 0, `ignore_eos`
so the reply has that length, and `stream_options.include_usage` for `prompt_tokens` and
`prompt_tokens_details.cached_tokens`. Measured from the moment the request is sent:
TTFT = the first chunk carrying a choice (a token was generated), e2e = the end of the stream,
TPOT = (e2e - TTFT) / (completion_tokens - 1). Failures come back as rows with `error` set.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import httpx

from kvstrata.bench.trace.format import TraceRequest
from kvstrata.bench.trace.tokens import BlockTokens


@dataclass
class ReplayRow:
    line: int  # the request's line in the trace
    scheduled_s: float  # when it was due, after the start
    sent_s: float  # when it was sent, after the start
    prompt_tokens_sent: int
    max_tokens: int
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int | None = None  # the server's usage
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        n = self.completion_tokens
        if self.ttft_s is None or self.e2e_s is None or not n or n < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (n - 1)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tpot_s": self.tpot_s}


def completions_url(url: str) -> str:
    url = url.rstrip("/")
    if url.endswith("/completions"):
        return url
    return url + ("/completions" if url.endswith("/v1") else "/v1/completions")


def schedule(requests: Sequence[TraceRequest], time_scale: float) -> list[float]:
    """Seconds after the start at which each request is due."""
    t0 = requests[0].timestamp_ms
    return [(r.timestamp_ms - t0) / 1000.0 / time_scale for r in requests]


async def _one(
    http: httpx.AsyncClient, endpoint: str, body: dict[str, Any], row: ReplayRow, t0: float
) -> None:
    sent = time.perf_counter()
    row.sent_s = sent - t0
    usage: dict[str, Any] = {}
    try:
        async with http.stream("POST", endpoint, json=body) as resp:
            if resp.status_code >= 400:
                text = (await resp.aread()).decode("utf-8", "replace")
                row.error = f"HTTP {resp.status_code}: {text[:300]}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    row.error = f"stream error: {json.dumps(chunk['error'])[:300]}"
                    return
                if chunk.get("choices") and row.ttft_s is None:
                    row.ttft_s = time.perf_counter() - sent
                if chunk.get("usage"):
                    usage = chunk["usage"]
    except (httpx.HTTPError, OSError, json.JSONDecodeError) as exc:
        row.error = f"{type(exc).__name__}: {exc}"
        return
    finally:
        row.e2e_s = time.perf_counter() - sent
    row.prompt_tokens = usage.get("prompt_tokens")
    row.completion_tokens = usage.get("completion_tokens")
    row.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if row.ttft_s is None:
        row.error = "the stream ended without a token"


async def replay(
    url: str, model: str, requests: Sequence[TraceRequest], mapping: BlockTokens, time_scale: float = 1.0,
    max_output_tokens: int = 32, timeout_s: float = 1800.0, api_key: str | None = None,
) -> tuple[list[ReplayRow], float]:
    """Send every request at its time; returns the rows (trace order) and the wall time (s)."""
    endpoint = completions_url(url)
    due = schedule(requests, time_scale)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=len(requests), max_keepalive_connections=64)
    rows: list[ReplayRow] = []
    tasks = []
    # connect may wait as long as a reply: a server busy computing accepts late, and that wait is
    # part of the request's TTFT, not a failure
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits,
                                 headers=headers) as http:
        t0 = time.perf_counter()
        for req, at in zip(requests, due):
            prompt = mapping.prompt(req)
            max_tokens = max(1, min(req.output_length, max_output_tokens))
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            row = ReplayRow(req.line, at, 0.0, len(prompt), max_tokens)
            rows.append(row)
            delay = at - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)  # pacing the open loop, not synchronisation
            tasks.append(asyncio.create_task(_one(http, endpoint, body, row, t0)))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    return rows, wall
