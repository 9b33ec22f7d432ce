"""The response cache between the HTTP routes and the engine: hit, miss or bypass for each request.

`ResponseCacheService.lookup` answers every /v1/completions and /v1/chat/completions request
with a `Ticket`:
- bypass: the cache is off (`--response-cache-size 0`), the request asks for logprobs or echo (a stored
  result keeps text only), or it opted out with `"cache": false` in its body or `Cache-Control: no-cache`
  (or no-store); nothing read or stored;
- hit: the key's list is full; `ticket.value` is replayed (replay.py);
- miss: this request leads one generation of the key (single flight: identical misses beyond
  what the key still needs wait for a running generation, then look again). The route passes
  the engine outputs through `ticket.record(...)`, which adds the result once every choice
  finished with stop/length, and must call `ticket.release()` when done (record does it too).
Every response carries `x-kvstrata-cache: hit|miss|bypass` (`ticket.headers`).

Flags are checked at construction (ConfigError), so a bad one stops the server at start. The key namespace
(model and chat template) needs the engine, so the cache itself, and the fixed keys, are built at
the first request that finds an engine. A key holds the request's tenant (tenants never share a
result), so each fixed request is a fixed key once per tenant the server knows (`tenants`: those
of its API keys, or the one anonymous tenant when keys are off).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterable

from fastapi import Request
from pydantic import BaseModel

from kvstrata.config_flags import ConfigError
from kvstrata.config_server import ServerConfig
from kvstrata.engine.outputs import RequestOutput
from kvstrata.engine.sampling_params import InvalidRequestError
from kvstrata.serving.auth import request_tenant
from kvstrata.serving.errors import quote
from kvstrata.metrics.rank import Metrics
from kvstrata.serving.prepare import check_model
from kvstrata.serving.response_cache.cache import ResponseCache
from kvstrata.serving.response_cache.header import CACHE_HEADER
from kvstrata.serving.response_cache.key import engine_namespace, is_deterministic, load_fixed_keys, request_key
from kvstrata.serving.response_cache.replay import FINISHED_NORMALLY, CachedChoice, CachedResponse
from kvstrata.serving.response_cache.single_flight import SingleFlight

if TYPE_CHECKING:
    from kvstrata.engine.async_engine import AsyncEngine

logger = logging.getLogger(__name__)
Outputs = AsyncIterator[tuple[int, RequestOutput]]


class Ticket:
    """One request's outcome with the response cache: 'hit' (with `value`), 'miss' or 'bypass'."""

    def __init__(
        self,
        status: str,
        value: CachedResponse | None = None,
        on_result: Callable[[CachedResponse], None] | None = None,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self.status = status
        self.value = value
        self._on_result = on_result
        self._on_end = on_end

    @property
    def headers(self) -> dict[str, str]:
        return {CACHE_HEADER: self.status}

    def release(self) -> None:
        """End this request's generation slot (idempotent): waiting identical misses look again."""
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end()

    def record(self, outputs: Outputs, prompt_lens: list[int], n: int) -> Outputs:
        """`outputs` as they are; for a miss, also keep the result if every choice ends normally."""
        if self._on_result is None:
            return outputs
        return self._recording(outputs, prompt_lens, n)

    async def _recording(self, outputs: Outputs, prompt_lens: list[int], n: int) -> Outputs:
        num = len(prompt_lens) * n
        texts: list[list[str]] = [[] for _ in range(num)]
        reasons: list[str | None] = [None] * num
        tokens = [0] * num
        try:
            async with aclosing(outputs) as inner:  # type: ignore[type-var]
                async for index, out in inner:
                    texts[index].append(out.new_text)
                    tokens[index] = out.output_tokens
                    if out.finished:
                        reasons[index] = out.finish_reason
                    yield index, out
            if self._on_result is not None and all(r in FINISHED_NORMALLY for r in reasons):
                choices = tuple(CachedChoice("".join(t), r or "", k) for t, r, k in zip(texts, reasons, tokens))
                self._on_result(CachedResponse(tuple(prompt_lens), n, choices))
        finally:
            self.release()


BYPASS = Ticket("bypass")


def _scored(req: BaseModel) -> bool:
    """Logprobs and echo are answered by the engine every time: a stored result keeps the text only."""
    return getattr(req, "logprobs", None) not in (None, False) or bool(getattr(req, "echo", False))


class ResponseCacheService:
    def __init__(
        self, cfg: ServerConfig, metrics: Metrics | None = None, tenants: Iterable[str | None] = (None,)
    ) -> None:
        size, list_size, path = cfg.response_cache_size, cfg.response_cache_list_size, cfg.response_cache_fixed_keys
        if size < 0:
            raise ConfigError(f"--response-cache-size must be >= 0 keys (0 = off), got {size}")
        if list_size < 1:
            raise ConfigError(f"--response-cache-list-size must be at least 1 result per key, got {list_size}")
        if path is not None and size == 0:
            raise ConfigError("--response-cache-fixed-keys needs the cache on: give --response-cache-size > 0")
        if path is not None and not os.path.isfile(path):
            raise ConfigError(
                f"--response-cache-fixed-keys {path}: no such file; give a JSON-lines file of request bodies"
            )
        self.size, self.list_size = size, list_size
        self.enabled = size > 0
        try:
            self._fixed_requests = load_fixed_keys(path) if path is not None else []
        except ValueError as exc:  # a line that is not a request body
            raise ConfigError(f"--response-cache-fixed-keys {exc}") from exc
        self._tenants = sorted(set(tenants), key=str)
        self._metrics = metrics
        self._cache: ResponseCache[CachedResponse] | None = None
        self._namespace = ""
        self._flights = SingleFlight()
        self.hits = 0
        self.misses = 0
        if metrics is not None:
            metrics.response_cache_entries.set_function(lambda: len(self._cache) if self._cache is not None else 0)

    async def lookup(self, route: str, req: BaseModel, request: Request, engine: AsyncEngine) -> Ticket:
        if not self.enabled or _scored(req) or await _opted_out(request):
            return BYPASS
        check_model(getattr(req, "model", None), engine)  # a hit must refuse what a miss refuses
        cache = self._bound(engine)
        # a canonical dump and hash of the whole body: CPU work, kept off the event loop
        key = await asyncio.to_thread(request_key, route, req, self._namespace, request_tenant(request))
        deterministic, seed = is_deterministic(req), getattr(req, "seed", None)
        while True:
            value = cache.get(key, seed)
            if value is not None:
                self._count(hit=True)
                return Ticket("hit", value)
            if self._flights.try_start(key, cache.needed(key, deterministic)):
                self._count(hit=False)
                on_result = functools.partial(self._add, key, deterministic=deterministic)
                return Ticket("miss", on_result=on_result, on_end=functools.partial(self._flights.end, key))
            await self._flights.wait(key)

    def stats(self) -> dict[str, Any]:
        cache = self._cache.stats() if self._cache is not None else None
        return {
            "enabled": self.enabled,
            "size": self.size,
            "list_size": self.list_size,
            "entries": cache.entries if cache else 0,
            "fixed_keys": cache.fixed_keys if cache else len(self._fixed_requests) * len(self._tenants),
            "hits": self.hits,
            "misses": self.misses,
            "evictions": cache.evictions if cache else 0,
        }

    def flush(self) -> int:
        """Drop every stored result; returns how many keys held results."""
        flushed = self._cache.flush() if self._cache is not None else 0
        logger.info("response_cache_flush keys=%d", flushed)
        return flushed

    def _bound(self, engine: AsyncEngine) -> ResponseCache[CachedResponse]:
        """The cache, built at the first request (the key namespace needs the loaded engine)."""
        if self._cache is None:
            self._namespace = engine_namespace(engine)
            fixed = [request_key(route, req, self._namespace, tenant)
                     for route, req in self._fixed_requests for tenant in self._tenants]
            self._cache = ResponseCache(self.size, self.list_size, fixed)
            logger.info(
                "response_cache_ready size=%d list_size=%d fixed_keys=%d", self.size, self.list_size, len(set(fixed))
            )
        return self._cache

    def _add(self, key: str, value: CachedResponse, deterministic: bool) -> None:
        assert self._cache is not None
        evicted = self._cache.add(key, value, deterministic)
        if evicted and self._metrics is not None:
            self._metrics.response_cache_evictions.inc(len(evicted))

    def _count(self, hit: bool) -> None:
        if hit:
            self.hits += 1
        else:
            self.misses += 1
        if self._metrics is not None:
            (self._metrics.response_cache_hits if hit else self._metrics.response_cache_misses).inc()


async def _opted_out(request: Request) -> bool:
    """`Cache-Control: no-cache` / `no-store`, or `"cache": false` in the body (400 if not a bool)."""
    control = request.headers.get("cache-control", "").lower()
    if "no-cache" in control or "no-store" in control:
        return True
    body = await request.json()  # parsed once already for validation; Starlette keeps it
    flag = body.get("cache", True) if isinstance(body, dict) else True
    if not isinstance(flag, bool):
        raise InvalidRequestError(f"cache must be true or false, got {quote(flag)}", "cache", "invalid_value")
    return not flag
