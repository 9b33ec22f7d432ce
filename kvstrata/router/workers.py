"""The ranks behind the gateway: their health, load, info and cache index.

    unknown ──probe 200──▶ ready ──connect error / probe fails──▶ down ──probe 200──▶ ready
              probe 503 (loading)──▶ loading ──────────────────────────────────────▶ ready

On every transition to ready the gateway reads `/v1/kvstrata/info` (model, page size, hash root,
KV event endpoints) and subscribes to the rank's events on a fresh, empty index; on going down it
stops the subscriber and empties the index (a restarted rank remembers nothing).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from kvstrata.router.cache_index import RankCacheIndex
from kvstrata.router.policy import RankLoad
from kvstrata.router.prefill_progress import PrefillProgress
from kvstrata.router.subscriber import KVEventSubscriber

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0
SLOW_PROBES_DOWN = 3
_ANY_HOST = ("*", "0.0.0.0", "::", "[::]", "")


@dataclass
class Worker:
    rank: int
    url: str
    status: str = "unknown"  # unknown | loading | ready | down
    info: dict[str, Any] = field(default_factory=dict)
    requests: int = 0  # in flight through the gateway
    tokens: int = 0
    prefill: PrefillProgress = field(default_factory=PrefillProgress)  # unanswered prefill (prefill_progress.py)
    probe_failures: int = 0
    index: RankCacheIndex = field(default_factory=lambda: RankCacheIndex(exact=False))
    subscriber: KVEventSubscriber | None = None

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    @property
    def prefill_tokens(self) -> int:
        """Uncached prompt tokens of in-flight requests not yet answering."""
        return self.prefill.tokens

    def load(self, match_tokens: int = 0, now: float | None = None) -> RankLoad:
        """`now` (monotonic seconds): price the queued prefill as the part not done by then; None: whole."""
        queued = self.prefill.tokens if now is None else self.prefill.remaining(now)
        return RankLoad(self.rank, self.requests, self.tokens, match_tokens, queued)

    def events_address(self, endpoint: str | None) -> str | None:
        """A bound endpoint as this gateway reaches it: the wildcard host becomes the rank's host."""
        if not endpoint or not endpoint.startswith("tcp://"):
            return endpoint
        host, _, port = endpoint[len("tcp://") :].rpartition(":")
        if host in _ANY_HOST:
            host = urlsplit(self.url).hostname or "127.0.0.1"
            host = f"[{host}]" if ":" in host else host
        return f"tcp://{host}:{port}"


class WorkerPool:
    def __init__(self, urls: list[str], headers: dict[str, str] | None = None) -> None:
        if not urls:
            raise ValueError("the gateway needs at least one rank: pass --worker URL (or --dp-size N)")
        self.workers = [Worker(rank, url.rstrip("/")) for rank, url in enumerate(urls)]
        self.headers = headers or {}  # the gateway's key, for /v1/kvstrata/info

    def ready(self) -> list[Worker]:
        return [w for w in self.workers if w.ready]

    def first_info(self) -> dict[str, Any] | None:
        return next((w.info for w in self.workers if w.ready and w.info.get("hash_root")), None)

    async def probe_all(self, client: httpx.AsyncClient) -> None:
        await asyncio.gather(*(self.probe(w, client) for w in self.workers))

    async def probe(self, w: Worker, client: httpx.AsyncClient) -> None:
        try:
            resp = await client.get(w.url + "/health", timeout=PROBE_TIMEOUT_S)
        except httpx.HTTPError as exc:
            w.probe_failures += 1  # refused: down now; slow (a busy CPU): down after a few in a row
            if isinstance(exc, httpx.ConnectError) or w.probe_failures >= SLOW_PROBES_DOWN:
                self.mark_down(w, f"unreachable ({type(exc).__name__})")
            return
        w.probe_failures = 0
        if resp.status_code == 200:
            if not w.ready:
                await self._become_ready(w, client)
            return
        status = _json(resp).get("status")
        if status == "loading" and w.status != "ready":
            w.status = "loading"
        else:
            self.mark_down(w, f"health {resp.status_code} {status}")

    async def _become_ready(self, w: Worker, client: httpx.AsyncClient) -> None:
        try:
            resp = await client.get(w.url + "/v1/kvstrata/info", timeout=PROBE_TIMEOUT_S, headers=self.headers)
        except httpx.HTTPError as exc:
            self.mark_down(w, f"info unreachable ({type(exc).__name__})")
            return
        w.info = _json(resp) if resp.status_code == 200 else {}  # not a kvstrata rank: no info
        self._stop_events(w)
        events = w.info.get("kv_events")
        w.index = RankCacheIndex(exact=bool(events), capacity=int(w.info.get("num_pages") or 1 << 20))
        if events:
            endpoint = w.events_address(events.get("endpoint"))
            replay = w.events_address(events.get("replay_endpoint"))
            if endpoint:
                w.subscriber = KVEventSubscriber(w.rank, endpoint, replay, events.get("topic") or "", w.index).start()
        w.status = "ready"
        logger.info(
            "router_rank_ready rank=%d url=%s kv_events=%s", w.rank, w.url, "on" if w.subscriber else "approximate"
        )

    def mark_down(self, w: Worker, reason: str) -> None:
        if w.status != "down":
            log = logger.warning if w.ready else logger.info
            log("router_rank_down rank=%d url=%s reason=%s", w.rank, w.url, reason)
        w.status = "down"
        self._stop_events(w)
        w.index.clear()

    @staticmethod
    def _stop_events(w: Worker) -> None:
        if w.subscriber is not None:
            w.subscriber.stop(timeout=0)
            w.subscriber = None

    def close(self) -> None:
        for w in self.workers:
            self._stop_events(w)


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
