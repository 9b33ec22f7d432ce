"""A hostile client against every route, with two tenants, while another tenant's stream runs.

The requests are the ones the OpenAI API refuses (and those issue 26 found accepted, stalling or
answering 500): each must get a small OpenAI-style JSON 4xx within the client's timeout, never a
5xx; the stream that started before them must keep getting tokens while they are answered and end
whole; and neither tenant may hit, read or probe the other's cached pages, cached responses or
stored responses (an id of the other tenant answers exactly as an id that never existed).
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any, Iterator, NamedTuple

import httpx
import pytest

from kvstrata.config_server import ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from polling import wait_for
from serving_support import make_state, serve

ALICE, BOB = "sk-hostile-alice", "sk-hostile-bob"
JSON_CT = {"Content-Type": "application/json"}
MSG = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


def auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


class Hostile(NamedTuple):
    name: str
    method: str
    path: str
    body: bytes | None = None
    key: str | None = BOB


def js(value: Any) -> bytes:
    return json.dumps(value).encode()


def chat(**extra: Any) -> bytes:
    return js({"messages": MSG, "max_tokens": 2, **extra})


def params(schema: Any) -> bytes:
    return chat(tools=[{"type": "function", "function": {"name": "f", "parameters": schema}}], tool_choice="required")


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


C, H, R, M = "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"


def msgs(**extra: Any) -> bytes:
    return js({"messages": MSG, "max_tokens": 2, **extra})


QUOTES = b'{"messages": [{"role": "user", "content": "' + b'"' + b'\\"' * 80_000  # the 160 KB body
CASES = [
    # who may call, and how
    Hostile("no key", "POST", H, chat(), key=None),
    Hostile("wrong key", "POST", R, js({"input": "hi"}), key="sk-nobody"),
    Hostile("no key, models", "GET", "/v1/models", key=None),
    Hostile("no key, metrics", "GET", "/metrics", key=None),
    Hostile("no key, rank info", "GET", "/v1/kvstrata/info", key=None),
    Hostile("no key, flush", "POST", "/flush_cache", key=None),
    Hostile("no key, response cache", "GET", "/response_cache", key=None),
    Hostile("no key, response cache flush", "POST", "/response_cache/flush", key=None),
    Hostile("no key, dashboard", "GET", "/dashboard", key=None),
    Hostile("no key, server info", "GET", "/server_info", key=None),
    Hostile("no key, model info", "GET", "/get_model_info", key=None),
    Hostile("no key, openapi", "GET", "/openapi.json", key=None),
    Hostile("wrong method, responses", "GET", R),
    Hostile("wrong method, models", "POST", "/v1/models", b"{}"),
    Hostile("no such route", "POST", "/v1/embeddings", js({"input": "x"})),
    Hostile("a 20 KB model id", "GET", "/v1/models/" + "m" * 20_000),
    # bodies that cost the server (the first one took minutes on the event loop)
    Hostile("160 KB of escaped quotes, unterminated", "POST", H, QUOTES),
    Hostile("4 MiB of escaped quotes, unterminated", "POST", R, b'{"input": "' + b'\\"' * (2 << 20)),
    Hostile("JSON nested 100,000 deep", "POST", C, b'{"prompt": ' + b"[" * 100_000),
    Hostile("not JSON", "POST", C, b"prompt=hi"),
    Hostile("a JSON array", "POST", R, b"[1, 2]"),
    # values no reply can hold (they answered 500)
    Hostile("NaN in responses' text", "POST", R, b'{"input": "hi", "text": {"format": {"type": "text"}, "x": NaN}}'),
    Hostile("Infinity temperature", "POST", C, b'{"prompt": "hi", "temperature": Infinity}'),
    Hostile("surrogate bytes in chat content", "POST", H, b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}'),
    Hostile("an escaped lone surrogate", "POST", R, b'{"input": "\\ud800 alone"}'),
    Hostile("invalid UTF-8", "POST", C, b'{"prompt": "\xff\xfe"}'),
    # what OpenAI refuses
    Hostile("tool name with a trailing newline", "POST", H, chat(tools=[{"type": "function", "function": {"name": "f\n"}}])),
    Hostile("tool_choice names a function, no tools", "POST", R,
            js({"input": "hi", "tool_choice": {"type": "function", "name": "f"}})),
    Hostile("tool_choice required, no tools", "POST", H, chat(tool_choice="required")),
    Hostile("json_schema with no schema", "POST", R, js({"input": "hi", "text": {"format": {"type": "json_schema",
                                                                                          "name": "x"}}})),
    Hostile("schema only a $ref to itself", "POST", H, params({"$ref": "#"})),
    Hostile("a $ref cycle", "POST", R, js({"input": "hi", "text": {"format": {
        "type": "json_schema", "name": "x", "schema": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                                                       "$ref": "#/$defs/a"}}}})),
    Hostile("10,000 properties", "POST", H, params({"type": "object", "properties": {f"p{i}": {"type": "string"}
                                                                                    for i in range(10_000)}})),
    Hostile("11 levels of nesting", "POST", H, params(nested(11))),
    Hostile("130,000 characters of enum", "POST", H, params({"type": "object", "properties": {
        "e": {"enum": ["x" * 1000] * 130}}})),
    # input echoed back in bulk (a 1 MB previous_response_id was)
    Hostile("a 1 MB previous_response_id", "POST", R, js({"input": "hi", "previous_response_id": "r" * 1_000_000})),
    Hostile("a 1 MB model name", "POST", C, js({"prompt": "hi", "model": "m" * 1_000_000})),
    Hostile("a 1 MB field name", "POST", R, js({"input": "hi", "x" * 1_000_000: 1})),
    Hostile("a 1 MB logit_bias key", "POST", C, js({"prompt": "hi", "logit_bias": {"1" * 1_000_000: 1}})),
    Hostile("token ids outside the vocabulary", "POST", C, js({"prompt": [10**9]})),
    Hostile("max_tokens past the context", "POST", H, chat(max_tokens=10**9)),
    # Anthropic's Messages API (answered in Anthropic's error shape)
    Hostile("messages, no key", "POST", M, msgs(), key=None),
    Hostile("messages, wrong key", "POST", M + "/count_tokens", msgs(), key="sk-nobody"),
    Hostile("messages, wrong method", "GET", M),
    Hostile("messages, no such route", "POST", M + "/batches", msgs()),
    Hostile("messages, 160 KB of escaped quotes", "POST", M, QUOTES),
    Hostile("messages, JSON nested 100,000 deep", "POST", M, b'{"messages": ' + b"[" * 100_000),
    Hostile("messages, a JSON array", "POST", M, b"[1, 2]"),
    Hostile("messages, no max_tokens", "POST", M, js({"messages": MSG})),
    Hostile("messages, NaN temperature", "POST", M, b'{"messages": [], "max_tokens": 2, "temperature": NaN}'),
    Hostile("messages, surrogate bytes", "POST", M, b'{"max_tokens": 2, "messages": [{"role": "user", "content": '
                                                    b'"\xed\xa0\x80"}]}'),
    Hostile("messages, an image block", "POST", M, msgs(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA" * 1000}}]}])),
    Hostile("messages, a block that is a number", "POST", M, msgs(messages=[{"role": "user", "content": [5]}])),
    Hostile("messages, tool_use input a string", "POST", M, msgs(messages=MSG + [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "x" * 100_000}]}])),
    Hostile("messages, tool_result without an id", "POST", M, msgs(messages=[{"role": "user", "content": [
        {"type": "tool_result", "content": "x"}]}])),
    Hostile("messages, a tool with no schema", "POST", M, msgs(tools=[{"name": "f"}])),
    Hostile("messages, tool_choice any, no tools", "POST", M, msgs(tool_choice={"type": "any"})),
    Hostile("messages, a tool schema $ref cycle", "POST", M, msgs(tools=[{"name": "f", "input_schema": {
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}}],
        tool_choice={"type": "tool", "name": "f"})),
    Hostile("messages, a 1 MB field name", "POST", M, js({"messages": MSG, "max_tokens": 2, "x" * 1_000_000: 1})),
    Hostile("messages, a 1 MB model name", "POST", M, msgs(model="m" * 1_000_000)),
    Hostile("messages, max_tokens past the context", "POST", M, msgs(max_tokens=10**9)),
    Hostile("messages, metadata.user_id a number", "POST", M, msgs(metadata={"user_id": 7})),
    Hostile("count_tokens, no messages", "POST", M + "/count_tokens", js({"model": "x"})),
]


class Stream:
    """Alice's long chat streams, one after another in a thread until `stop`: when each chunk came,
    and how each stream ended."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.chunks = 0
        self.finishes: list[str | None] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"messages": [{"role": "user", "content": "a long story"}], "max_tokens": 1000, "temperature": 0,
                "ignore_eos": True, "stream": True}
        try:
            while not self.stop.is_set():
                finish = None
                with httpx.stream("POST", f"{self.base_url}{H}", json=body, headers=auth(ALICE), timeout=600) as resp:
                    assert resp.status_code == 200, resp.read()
                    for line in resp.iter_lines():
                        if line.startswith("data: {"):
                            self.chunks += 1
                            finish = json.loads(line[6:])["choices"][0]["finish_reason"] or finish
                self.finishes.append(finish)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


@pytest.fixture(scope="module")
def base_url(engine: AsyncEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    keys = tmp_path_factory.mktemp("hostile") / "keys.txt"
    keys.write_text(f"{ALICE} alice\n{BOB} bob\n")
    cfg = ServerConfig(port=0, api_key_file=str(keys), response_cache_size=64)
    with serve(make_state(engine, cfg)) as srv:
        yield srv.base_url


def _check_refusal(case: Hostile, resp: httpx.Response) -> None:
    assert 400 <= resp.status_code < 500, (case.name, resp.status_code, resp.content[:300])
    assert resp.headers["content-type"].startswith("application/json"), case.name
    if case.path.startswith(M):  # Anthropic's shape
        body = resp.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, (case.name, body)
        assert body["error"]["message"] and body["error"]["type"].endswith("_error"), (case.name, body)
    else:
        err = resp.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], (case.name, err)
    assert len(resp.content) < 4096, (case.name, len(resp.content))  # nothing echoed in bulk


def test_hostile_requests_get_a_small_4xx_while_a_stream_flows(base_url: str, engine: AsyncEngine) -> None:
    stream = Stream(base_url)
    stream.thread.start()
    try:
        assert wait_for(lambda: stream.chunks >= 3 or stream.error is not None, 120), "the stream never began"
        with httpx.Client(base_url=base_url, timeout=60) as http:  # a stalled answer is a ReadTimeout here
            for case in CASES:
                before = stream.chunks
                resp = http.request(case.method, case.path, content=case.body, headers={**JSON_CT, **auth(case.key)})
                _check_refusal(case, resp)
                # and the stream goes on (the body held the event loop, and every stream, for minutes)
                assert wait_for(lambda: stream.chunks > before or stream.error is not None, 60), case.name
                assert stream.error is None, stream.error
    finally:
        stream.stop.set()
        stream.thread.join(600)
    assert stream.error is None, stream.error
    assert stream.finishes and set(stream.finishes) == {"length"}, stream.finishes  # every stream whole
    assert wait_for(lambda: not engine.engine.has_unfinished(), 60)
    engine.call_blocking(lambda e: e.check_integrity())  # no page leaked by a refused request


def _post(http: httpx.Client, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return http.post(path, json=body, headers=auth(key))


def test_no_cross_tenant_hit_read_or_id_oracle(base_url: str) -> None:
    prompt = f"{uuid.uuid4()} " + "the quick brown fox jumps over the lazy dog " * 12
    with httpx.Client(base_url=base_url, timeout=120) as http:
        # prefix cache: bob never finds alice's pages (nor their timing)
        cached = []
        for key in (ALICE, ALICE, BOB):
            resp = _post(http, key, C, {"prompt": prompt, "max_tokens": 2, "temperature": 0, "cache": False})
            assert resp.status_code == 200, resp.text
            cached.append(resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        assert cached[0] == 0 and cached[1] >= 96 and cached[2] == 0, cached
        # response cache: alice's answer is hers
        body = {"prompt": f"{uuid.uuid4()} hello", "max_tokens": 2, "temperature": 0}
        got = [_post(http, key, C, body).headers["x-kvstrata-cache"] for key in (ALICE, ALICE, BOB)]
        assert got == ["miss", "hit", "miss"]
        # stored responses: bob can neither chain alice's nor tell it exists
        first = _post(http, ALICE, R, {"input": prompt, "max_output_tokens": 2, "temperature": 0})
        assert first.status_code == 200, first.text
        rid = first.json()["id"]
        chained = _post(http, ALICE, R, {"input": "more", "previous_response_id": rid, "max_output_tokens": 2})
        assert chained.status_code == 200 and chained.json()["usage"]["input_tokens_details"]["cached_tokens"] >= 96
        unknown = "resp_" + uuid.uuid4().hex
        for stream in (False, True):
            answers = [_post(http, BOB, R, {"input": "x", "previous_response_id": r, "stream": stream})
                       for r in (rid, unknown)]
            bodies = [a.json()["error"] for a in answers]
            assert [a.status_code for a in answers] == [400, 400]
            assert bodies[0]["message"].replace(rid, "ID") == bodies[1]["message"].replace(unknown, "ID")
            assert {k: v for k, v in bodies[0].items() if k != "message"} == \
                {k: v for k, v in bodies[1].items() if k != "message"}
