"""Server-sent events: chunk shapes, [DONE], include_usage, n > 1, and agreement with non-streaming."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai

from serving_support import USER

GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 10, "extra_body": {"ignore_eos": True}}


def test_chat_stream_matches_non_stream(client: openai.OpenAI, model_name: str) -> None:
    full = client.chat.completions.create(model=model_name, messages=USER, **GREEDY)
    chunks = list(client.chat.completions.create(model=model_name, messages=USER, stream=True, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == full.choices[0].message.content
    reasons = [c.choices[0].finish_reason for c in chunks]
    assert reasons[-1] == "length" and set(reasons[:-1]) == {None}
    assert all(c.usage is None for c in chunks)


def test_include_usage_sends_a_final_usage_chunk(client: openai.OpenAI, model_name: str) -> None:
    chunks = list(client.chat.completions.create(
        model=model_name, messages=USER, stream=True, stream_options={"include_usage": True}, **GREEDY
    ))
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 10
    assert last.usage.total_tokens == last.usage.prompt_tokens + 10
    assert last.usage.prompt_tokens_details is not None
    assert all(c.usage is None for c in chunks[:-1])


def test_raw_sse_framing(http: httpx.Client, model_name: str) -> None:
    body = {"model": model_name, "prompt": "hello", "max_tokens": 3, "stream": True, "ignore_eos": True}
    with http.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = resp.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert all(p["object"] == "text_completion" for p in payloads)
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"


def test_completion_stream_with_n_interleaves_choices(client: openai.OpenAI, model_name: str) -> None:
    kw: dict[str, Any] = {"model": model_name, "prompt": "hello", "max_tokens": 5, "seed": 11, "temperature": 1.0,
                          "extra_body": {"ignore_eos": True}}
    full = client.completions.create(n=3, **kw)
    texts = ["", "", ""]
    finished = set()
    for chunk in client.completions.create(n=3, stream=True, **kw):
        [choice] = chunk.choices
        texts[choice.index] += choice.text
        if choice.finish_reason:
            finished.add(choice.index)
    assert finished == {0, 1, 2}
    assert texts == [c.text for c in full.choices]


def test_errors_before_the_first_token_keep_their_status(client: openai.OpenAI, model_name: str) -> None:
    try:
        client.chat.completions.create(model=model_name, messages=USER, stream=True, temperature=-1)
    except openai.BadRequestError as exc:
        assert exc.param == "temperature"
    else:
        raise AssertionError("a streamed request with temperature=-1 must be refused with 400")


def test_concurrent_streams_and_requests(client: openai.OpenAI, model_name: str) -> None:
    def one(i: int) -> int:
        kw: dict[str, Any] = {"model": model_name, "messages": [{"role": "user", "content": f"request {i}"}],
                              "max_tokens": 7 + i % 3, "extra_body": {"ignore_eos": True}}
        if i % 2:
            out = client.chat.completions.create(**kw)
            assert out.choices[0].finish_reason == "length"
            return out.usage.completion_tokens  # type: ignore[union-attr]
        chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        return chunks[-1].usage.completion_tokens  # type: ignore[union-attr]

    with ThreadPoolExecutor(12) as pool:
        assert list(pool.map(one, range(24))) == [7 + i % 3 for i in range(24)]
