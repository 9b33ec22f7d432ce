"""CPU work a request brings runs off the event loop that carries every stream: the body scan of a
large body, the chat template, tokenizer and schema checks (prepare), the response cache's key,
and the gateway's prompt hashing. Each is recorded by the thread it ran on."""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Iterator

import httpx
import pytest

from kvstrata.config_server import RouterConfig, ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.router.gateway import Gateway
from kvstrata.serving import limits, openai_api
from kvstrata.serving.response_cache import service
from kvstrata.serving.responses import route
from serving_support import make_state, serve

LOOP_THREAD = "kvstrata-uvicorn"  # ServerThread's: the event loop's thread


def recording(fn: Callable[..., Any], threads: list[str]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kw: Any) -> Any:
        threads.append(threading.current_thread().name)
        return fn(*args, **kw)

    return wrapper


@pytest.fixture()
def threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[str]]]:
    seen: dict[str, list[str]] = {"scan": [], "prepare": [], "key": []}
    monkeypatch.setattr(limits, "scan_body", recording(limits.scan_body, seen["scan"]))
    monkeypatch.setattr(openai_api, "prepare_chat", recording(openai_api.prepare_chat, seen["prepare"]))
    monkeypatch.setattr(route, "prepare_chat", recording(route.prepare_chat, seen["prepare"]))
    monkeypatch.setattr(service, "request_key", recording(service.request_key, seen["key"]))
    yield seen


def test_request_cpu_work_runs_off_the_event_loop(engine: AsyncEngine, threads: dict[str, list[str]]) -> None:
    big = "u" * 100_000  # a body over limits.INLINE_CHECK_BYTES (in a field that is not prompt)
    with serve(make_state(engine, ServerConfig(port=0, response_cache_size=8))) as srv, \
            httpx.Client(base_url=srv.base_url, timeout=120) as http:
        chat = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "user": big,
                                                                "max_tokens": 1})
        assert chat.status_code == 200, chat.text
        resp = http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 1})
        assert resp.status_code == 200, resp.text
    assert threads["scan"] and threads["prepare"] and threads["key"], threads
    assert LOOP_THREAD not in threads["scan"][:1]  # the big body's scan
    assert LOOP_THREAD not in threads["prepare"] + threads["key"], threads


def test_the_gateway_hashes_prompts_in_its_hashing_thread() -> None:
    seen: list[str] = []

    class Hasher:
        page_size = 16

        def prompt(self, path: str, body: dict[str, Any], tenant: str | None) -> None:
            seen.append(threading.current_thread().name)

    gateway = Gateway(["http://127.0.0.1:9"], RouterConfig(policy="cache_aware"))  # never called
    gateway.hasher = Hasher()  # type: ignore[assignment]
    try:
        asyncio.run(gateway.hash_prompt("/v1/chat/completions", {"messages": []}, "alice"))
    finally:
        gateway.pool.close()
    assert seen and seen[0].startswith("kvstrata-router-hash"), seen
