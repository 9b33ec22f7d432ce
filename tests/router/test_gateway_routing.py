"""First requests through the real Gateway.proxy: simultaneous ones split across ranks (each decision
counts against its rank's load, in-flight requests and queued prefill, before the next is made), and by
cost sessions sharing one prefix spread instead of following the rank that cached it first. The ranks are
httpx mock transports that hold every request until all have arrived, so all are in flight at once;
no timing is asserted."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from kvstrata.config_server import RouterConfig
from kvstrata.router.gateway import Gateway
from kvstrata.router.prompt import Prompt

URLS = ["http://rank0.test", "http://rank1.test"]


class OneChunk(httpx.AsyncByteStream):
    async def __aiter__(self):  # type: ignore[override]
        yield b"{}"


class FakeHasher:
    """Stands in for the tokenizer: a body's `tokens` field is its prompt size; its pages hash apart."""

    page_size = 16

    def prompt(self, path: str, body: dict[str, Any], tenant: str | None) -> Prompt:
        n, shared = int(body["tokens"]), int(body.get("shared", 0))  # `shared` leading tokens all agents send
        pages = [hash(("system", i)) for i in range(shared // self.page_size)]
        return Prompt(n, pages + [hash((body["agent"], i)) for i in range(len(pages), n // self.page_size)])


async def route_together(policy: str, agents: list[tuple[str, int]], shared: int = 0, together: bool = True) -> list[int]:
    """Send one first request per agent, all at once (or one after another); the rank each reached, in the
    agents' order. `shared`: leading tokens every agent's prompt has in common."""
    arrived: dict[str, int] = {}
    all_in = asyncio.Event()

    async def rank(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        arrived[body["agent"]] = URLS.index(f"{request.url.scheme}://{request.url.host}")
        if len(arrived) == len(agents) or not together:
            all_in.set()
        await all_in.wait()  # every request is in flight before any answers
        return httpx.Response(200, stream=OneChunk())

    gw = Gateway(URLS, RouterConfig(policy=policy))
    gw._client = httpx.AsyncClient(transport=httpx.MockTransport(rank))
    gw.hasher = FakeHasher()  # type: ignore[assignment]
    for w in gw.pool.workers:
        w.status = "ready"
    try:
        raws = [json.dumps({"agent": a, "tokens": n, "shared": shared, "messages": [], "max_tokens": 8}).encode()
                for a, n in agents]

        async def finish(resp: Any) -> None:  # the response's release, as the server runs it after sending
            async for _ in resp.body_iterator:
                pass
            await resp.background()

        if together:
            for resp in await asyncio.gather(*(gw.proxy("/v1/chat/completions", raw, {}, 0.0) for raw in raws)):
                await finish(resp)
        else:
            for raw in raws:
                await finish(await gw.proxy("/v1/chat/completions", raw, {}, 0.0))
        assert all(w.requests == 0 and w.tokens == 0 and w.prefill_tokens == 0 for w in gw.pool.workers)
        return [arrived[a] for a, _ in agents]
    finally:
        await gw._client.aclose()
        gw._hashing.shutdown(wait=False)


@pytest.mark.parametrize("policy", ["cost", "cache_aware", "least_load"])
def test_three_agents_started_together_split_two_to_one(policy: str) -> None:
    agents = [("coder", 3000), ("reviewer", 1200), ("planner", 2500)]
    for _ in range(20):
        ranks = asyncio.run(route_together(policy, agents))
        assert sorted(ranks.count(r) for r in (0, 1)) == [1, 2], ranks


def test_simultaneous_requests_each_see_the_prefill_queued_before_them() -> None:
    """By cost, a long prompt's queued prefill sends the short ones that arrive with it to the other rank
    (a rotation that counted nothing would alternate)."""
    agents = [("indexer", 6000), ("a", 500), ("b", 400), ("c", 300)]
    for _ in range(5):
        ranks = asyncio.run(route_together("cost", agents))
        assert ranks[1:] == [1 - ranks[0]] * 3, ranks


@pytest.mark.parametrize(("policy", "smallest"), [("cost", 2), ("cache_aware", 0)])
def test_sessions_sharing_a_prefix_one_after_another(policy: str, smallest: int) -> None:
    """Six sessions with one 1,600-token system prompt, each first request done before the next: by match
    (cache_aware) every one follows the rank that cached the prefix first; by cost, once two sessions
    have shown the prefix is shared, it is priced as held everywhere and the sessions spread."""
    agents = [(f"agent{i}", 2000) for i in range(6)]
    ranks = asyncio.run(route_together(policy, agents, shared=1600, together=False))
    assert min(ranks.count(0), ranks.count(1)) == smallest, ranks
