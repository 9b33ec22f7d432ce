"""Gateway: one OpenAI endpoint in front of N engine ranks; picks a rank per request and streams through.

    POST /v1/chat/completions, /v1/completions, /v1/responses
      parse JSON ─▶ data_parallel_rank? pin : previous_response_id's rank? pin
                  : policy.choose(loads, cached match per rank, hashed with the key's tenant)
      ─▶ send upstream ─▶ first chunk ─▶ StreamingResponse(first + the rest, as they come)

Nothing is buffered: chunks go out as the rank sends them. A rank that refuses the connection,
drops it, or answers 502/503/504 before its first byte is marked down and the request moves to the
next least-loaded ready rank (the client has seen nothing yet). After the first byte a broken
upstream ends the client's stream. `Gateway.start()` probes the ranks and keeps probing them.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import time
from dataclasses import replace
from typing import Any

import httpx
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from kvstrata.config_server import RouterConfig
from kvstrata.router.key_affinity import KeyAffinity, affinity_key
from kvstrata.router.policy import Decision, make_policy
from kvstrata.router.prompt import Prompt, PromptHasher
from kvstrata.metrics.gateway import RouterMetrics
from kvstrata.router.passthrough import Release, any_rank, finish, passthrough
from kvstrata.router.response_ranks import ResponseRanks
from kvstrata.router.shared_prefix import SharedPrefixes
from kvstrata.router.workers import Worker, WorkerPool
from kvstrata.serving.errors import APIError, quote
from kvstrata.serving.responses.route import RESPONSE_ID_HEADER

logger = logging.getLogger(__name__)

RETRY_STATUSES = (502, 503, 504)
DROP_HEADERS = ("content-length", "transfer-encoding", "connection", "keep-alive", "date", "server")
SEND_HEADERS = ("content-type", "authorization", "accept", "x-request-id")
INLINE_PARSE_BYTES = 64 * 1024  # larger bodies are parsed in the hashing thread


class Gateway:
    def __init__(self, urls: list[str], cfg: RouterConfig, rank_key: str | None = None) -> None:
        self.cfg = cfg
        # the gateway's own calls to ranks (info, metrics, flush) carry one of its keys
        self.rank_headers = {"Authorization": f"Bearer {rank_key}"} if rank_key else {}
        self.pool = WorkerPool(urls, self.rank_headers)
        self.policy = make_policy(cfg)
        self.affinity = KeyAffinity(cfg)  # prompt_cache_key -> rank (key_affinity.py)
        self.shared = SharedPrefixes()  # prefixes many conversations share (shared_prefix.py)
        self.response_ranks = ResponseRanks()  # (tenant, response id) -> the rank that stored it
        self.metrics = RouterMetrics()
        self.hasher: PromptHasher | None = None  # loaded once a rank says which model it serves
        self._hasher_failed = False
        self._client: httpx.AsyncClient | None = None
        self._hashing = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvstrata-router-hash")
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def client(self) -> httpx.AsyncClient:
        assert self._client is not None, "Gateway.start() first"
        return self._client

    @property
    def prompt_matching(self) -> str:
        """off (the policy matches nothing, or the tokenizer failed), loading, or ready."""
        if not self.policy.needs_match or self._hasher_failed:
            return "off"
        return "ready" if self.hasher is not None else "loading"

    async def start(self) -> None:
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0), limits=limits)
        self._tasks.append(asyncio.create_task(self._probe_forever()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.pool.close()
        self._hashing.shutdown(wait=False)
        if self._client is not None:
            await self._client.aclose()

    async def _probe_forever(self) -> None:
        while True:
            try:
                await self.pool.probe_all(self.client)
                if self.hasher is None and self.policy.needs_match and not self._hasher_failed:
                    await self._load_hasher()
            except Exception:  # the prober must survive anything a rank answers
                logger.exception("router_probe_failed")
            await asyncio.sleep(self.cfg.health_check_interval)

    async def _load_hasher(self) -> None:
        info = self.pool.first_info()
        if info is None:
            return
        model = self.cfg.router_tokenizer or info["model"]
        root = bytes.fromhex(info["hash_root"])
        try:
            self.hasher = await asyncio.to_thread(PromptHasher.load, model, int(info["page_size"]), root,
                                                  str(info.get("tool_call_parser") or "auto"))
        except (OSError, ValueError) as exc:
            logger.error("router_tokenizer_failed model=%s error=%s; routing by load only", model, exc)
            self._hasher_failed = True
            return
        roots = {w.info.get("hash_root") for w in self.pool.ready()}
        if len(roots) > 1:
            logger.warning("router_hash_roots_differ roots=%d: ranks serve different models or page sizes", len(roots))
        logger.info("router_tokenizer_ready model=%s page_size=%s", model, info["page_size"])

    # -- routing ---------------------------------------------------------------------------------

    def pinned(self, body: dict[str, Any]) -> Worker | None:
        rank = body.get("data_parallel_rank")
        if rank is None:
            return None
        n = len(self.pool.workers)
        if type(rank) is not int or not 0 <= rank < n:
            raise APIError(
                400, f"data_parallel_rank must be an integer in [0, {n}), got {quote(rank)}",
                param="data_parallel_rank",
                code="invalid_rank",
            )
        return self.pool.workers[rank]

    def chained(self, path: str, body: dict[str, Any], tenant: str | None) -> Worker | None:
        """The ready rank that stored this /v1/responses request's previous response, if known."""
        if not path.endswith("/responses"):
            return None
        rank = self.response_ranks.rank_of(tenant, body.get("previous_response_id"))
        worker = self.pool.workers[rank] if rank is not None and rank < len(self.pool.workers) else None
        return worker if worker is not None and worker.ready else None

    async def hash_prompt(self, path: str, body: dict[str, Any], tenant: str | None) -> Prompt | None:
        """The prompt's size and page hashes when the policy matches caches. Rendering and tokenizing
        are CPU work: they run in the gateway's hashing thread (one, so the hasher's memo needs no
        lock), never on the event loop that carries every stream."""
        if self.hasher is None or not self.policy.needs_match:
            return None
        return await asyncio.get_running_loop().run_in_executor(self._hashing, self.hasher.prompt, path, body, tenant)

    def choose(
        self, body: dict[str, Any], ready: list[Worker], prompt: Prompt | None, headers: dict[str, str] | None = None,
    ) -> tuple[Worker, Decision, int]:
        """The rank, the decision, and the prompt's tokens not cached there (its prefill, queued on that
        rank until it answers: the cost policy's load). Synchronous from the loads to the caller's
        Release, so simultaneous requests each count the ones decided before them."""
        ps = self.hasher.page_size if self.hasher is not None else 0
        n = prompt.num_tokens if prompt else 0
        key = affinity_key(body, headers or {})
        now = time.monotonic()
        # the sessions each rank will hear from again, for a policy that prices them
        homed = self.affinity.active_sessions(now, exclude=key) if self.policy.needs_sessions else {}
        loads = [replace(w.load(w.index.match_pages(prompt.hashes) * ps if prompt else 0, now),
                         sessions=homed.get(w.rank, 0)) for w in ready]
        shared = self.shared.shared_pages(prompt.hashes) * ps if prompt else 0
        if prompt:
            self.shared.observe(prompt.hashes)
        decision = self.policy.choose(loads, n, shared)
        if key is not None:  # the same session sticks to one rank (key_affinity.py)
            decision = self.affinity.route(key, loads, decision, n, self.policy.session_cost(n, shared), now)
        chosen = next(r for r in loads if r.rank == decision.rank)
        return next(w for w in ready if w.rank == decision.rank), decision, max(n - chosen.match_tokens, 0)

    def fallbacks(self, tried: set[int]) -> list[Worker]:
        rest = [w for w in self.pool.ready() if w.rank not in tried]
        return sorted(rest, key=lambda w: (w.tokens, w.requests))

    # -- proxying --------------------------------------------------------------------------------

    async def proxy(
        self, path: str, raw: bytes, headers: dict[str, str], started: float, tenant: str | None = None
    ) -> Response:
        """`tenant`: the API key's (auth.request_tenant), which the ranks mix into their page hashes."""
        loop = asyncio.get_running_loop()
        body = _parse(raw) if len(raw) <= INLINE_PARSE_BYTES else await loop.run_in_executor(self._hashing, _parse, raw)
        if not isinstance(body, dict):
            raise APIError(400, "the request body is not a JSON object; send one", code="invalid_json")
        pin = self.pinned(body)
        if "data_parallel_rank" in body:  # the gateway's to act on; each rank is rank 0 of its own
            raw = json.dumps({k: v for k, v in body.items() if k != "data_parallel_rank"}).encode()
        ready = self.pool.ready()
        if pin is not None:
            if not pin.ready:
                raise APIError(503, f"rank {pin.rank} is {pin.status}; retry, or drop data_parallel_rank",
                               "server_error", code="rank_unavailable")
            worker, decision, prompt, uncached = pin, Decision(pin.rank, "pinned"), None, 0
        elif not ready:
            raise APIError(503, "no engine rank is ready; retry when GET /health returns 200", "server_error",
                           code="no_rank_ready")
        elif (chained := self.chained(path, body, tenant)) is not None:
            worker, decision, prompt, uncached = chained, Decision(chained.rank, "previous_response"), None, 0
        else:
            prompt = await self.hash_prompt(path, body, tenant)
            ready = [w for w in ready if w.ready] or self.pool.ready()  # ranks may have gone while it hashed
            if not ready:
                raise APIError(503, "no engine rank is ready; retry when GET /health returns 200", "server_error",
                               code="no_rank_ready")
            worker, decision, uncached = self.choose(body, ready, prompt, headers)
        cost = (prompt.num_tokens if prompt else len(raw) // 4) + _max_tokens(body)
        send = send_headers(headers)
        tried: set[int] = set()
        overhead = time.perf_counter() - started  # parse, tokenize, hash, route: up to the first send
        while True:
            tried.add(worker.rank)
            done = Release(worker, cost, uncached)
            try:
                upstream = await self.client.send(
                    self.client.build_request("POST", worker.url + path, content=raw, headers=send), stream=True
                )
                done.begun(ok=upstream.status_code == 200)
                chunks = upstream.aiter_raw()
                try:
                    first = await chunks.__anext__()
                except StopAsyncIteration:
                    first = b""
                except BaseException:
                    await upstream.aclose()
                    raise
            except httpx.TransportError as exc:
                done()
                self.pool.mark_down(worker, f"{type(exc).__name__} before the first byte")
                nxt = None if pin is not None else next(iter(self.fallbacks(tried)), None)
                if nxt is None:
                    raise APIError(503, f"rank {worker.rank} failed ({type(exc).__name__}) and no other rank is ready",
                                   "server_error", code="rank_unavailable") from None
                self.metrics.retries.labels(rank=str(worker.rank)).inc()
                worker, uncached = nxt, prompt.num_tokens if prompt else 0
                continue
            except BaseException:  # cancelled (the client left) or a bug: undo the load
                done()
                raise
            if upstream.status_code in RETRY_STATUSES and pin is None and self.fallbacks(tried):
                await upstream.aclose()
                done()
                self.pool.mark_down(worker, f"HTTP {upstream.status_code}")
                self.metrics.retries.labels(rank=str(worker.rank)).inc()
                worker, uncached = self.fallbacks(tried)[0], prompt.num_tokens if prompt else 0
                continue
            break
        policy = "pinned" if pin is not None else self.policy.name
        ratio = decision.match_ratio if prompt is not None and worker.rank == decision.rank else None
        reason = decision.reason if worker.rank == decision.rank else "retry"
        self.metrics.routed(worker.rank, policy, ratio, overhead, reason)
        if prompt is not None:
            worker.index.add_routed(prompt.hashes)  # approximate mode only
        if (response_id := upstream.headers.get(RESPONSE_ID_HEADER)) is not None:
            self.response_ranks.remember(tenant, response_id, worker.rank)
        logger.debug("router_route rank=%d reason=%s ratio=%s tries=%d", worker.rank, decision.reason, ratio, len(tried))
        out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in DROP_HEADERS}
        out_headers["x-kvstrata-rank"] = str(worker.rank)
        return StreamingResponse(
            passthrough(first, chunks, upstream, done), status_code=upstream.status_code, headers=out_headers,
            background=BackgroundTask(finish, upstream, done),  # also when the stream never started
        )

    async def get_json(self, path: str, headers: dict[str, str]) -> Response:
        """A GET any ready rank can answer (/v1/models), with the client's credentials."""
        return await any_rank(self.pool, self.client, "GET", path, send_headers(headers))

    async def fan_out(self, method: str, path: str) -> dict[int, httpx.Response | None]:
        """The same request to every ready rank at once (metrics, flush); None where it failed."""
        ready = self.pool.ready()

        async def one(w: Worker) -> httpx.Response | None:
            try:
                return await self.client.request(method, w.url + path, timeout=10, headers=self.rank_headers)
            except httpx.HTTPError:
                return None

        results = await asyncio.gather(*(one(w) for w in ready))
        return {w.rank: r for w, r in zip(ready, results)}


def send_headers(headers: dict[str, str]) -> dict[str, str]:
    """The client's headers a rank gets (its key among them, so the rank puts the request in its tenant)."""
    return {k: v for k, v in headers.items() if k in SEND_HEADERS}


def _parse(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _max_tokens(body: dict[str, Any]) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if type(value) is int and value > 0:
            return value
    return 16
