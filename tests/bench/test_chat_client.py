"""The streaming client against a real HTTP peer (the test double in conftest.py)."""
from __future__ import annotations

import asyncio
import socket

import pytest

from _fake_openai_peer import CACHED_TOKENS, CHUNKS, TTFT_DELAY_S, FakePeer, reply_for
from kvstrata.bench.client import ChatClient, ChatResult, chat_completions_url

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def chat(url: str, model: str, max_tokens: int = 9) -> ChatResult:
    async def run() -> ChatResult:
        async with ChatClient(url, model, max_tokens) as client:
            return await client.chat(MESSAGES)

    return asyncio.run(run())


def test_streamed_reply_timings_and_usage(fake_peer: FakePeer) -> None:
    fake_peer.reset()
    r = chat(fake_peer.url, "ok", max_tokens=9)
    assert r.ok and r.text == reply_for(MESSAGES) and r.finish_reason == "length"
    assert r.ttft_s is not None and TTFT_DELAY_S <= r.ttft_s < r.e2e_s  # the role chunk does not count
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (100, CHUNKS, CACHED_TOKENS)
    assert r.content_chunks == CHUNKS
    body = fake_peer.requests[-1]
    assert body["messages"] == MESSAGES and body["model"] == "ok"
    assert (body["temperature"], body["max_tokens"], body["stream"]) == (0, 9, True)
    assert body["stream_options"] == {"include_usage": True}


def test_peer_without_cached_tokens_gives_none(fake_peer: FakePeer) -> None:
    r = chat(fake_peer.url + "/v1", "no-cache-field")
    assert r.ok and r.cached_tokens is None and r.prompt_tokens == 100


def test_http_error_is_recorded_not_raised(fake_peer: FakePeer) -> None:
    r = chat(fake_peer.url, "fail")
    assert not r.ok and r.error is not None and r.error.startswith("HTTP 500") and "boom" in r.error
    assert r.ttft_s is None and r.text == ""


def test_unreachable_server_is_recorded_not_raised() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = chat(f"http://127.0.0.1:{port}", "ok")
    assert not r.ok and "Connect" in (r.error or "")


@pytest.mark.parametrize(
    "url", ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/chat/completions"]
)
def test_url_forms(url: str) -> None:
    assert chat_completions_url(url) == "http://h:1/v1/chat/completions"
