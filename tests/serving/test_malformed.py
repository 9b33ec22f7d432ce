"""Malformed requests, table-driven: every one gets a 4xx OpenAI-style JSON error, never a 5xx, a
hang, a reset connection or a plain-text body. The raw-socket cases cover what an HTTP client
library would refuse to send (a lying Content-Length, a broken request line, huge headers).

Decisions the table encodes (see kvstrata/serving/protocol.py):
- unknown top-level fields are ignored, as vLLM does (OpenAI itself refuses them); clients send
  vendor fields through `extra_body` and must keep working against either server;
- a missing `model` means the served model (vLLM's behaviour; the DP gateway relies on it);
- duplicate JSON keys: the last one wins (Python's json, RFC 8259 leaves it open).
"""
from __future__ import annotations

import json
import socket
from typing import Any, Iterator, NamedTuple

import httpx
import pytest

from kvstrata.config_server import ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from serving_support import USER, make_state, serve

MAX_BODY = 64 * 1024
JSON_CT = {"Content-Type": "application/json"}
C, H = "/v1/completions", "/v1/chat/completions"


class Case(NamedTuple):
    name: str
    path: str
    body: Any  # bytes are sent as they are; anything else as JSON
    status: int | tuple[int, ...] = 400
    param: str | None = None
    method: str = "POST"
    headers: dict[str, str] | None = None


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": USER, "max_tokens": 2, **fields}


def comp(**fields: Any) -> dict[str, Any]:
    return {"prompt": "hi", "max_tokens": 2, **fields}


def msg(**fields: Any) -> dict[str, Any]:
    return chat(messages=[fields])


CASES = [
    # the body itself
    Case("invalid json", H, b'{"messages": ['),
    Case("empty body", H, b""),
    Case("json array body", C, b'["hi"]'),
    Case("json string body", C, b'"hi"'),
    Case("json number body", C, b"42"),
    Case("json null body", H, b"null"),
    Case("text/plain content type", H, json.dumps(chat()).encode(), (400, 415), headers={"Content-Type": "text/plain"}),
    Case("form body", C, b"prompt=hi&max_tokens=2", (400, 415),
         headers={"Content-Type": "application/x-www-form-urlencoded"}),
    Case("non-utf8 bytes", C, b'{"prompt": "\xff\xfe\xfd", "max_tokens": 2}'),
    Case("latin-1 in a key", C, b'{"pr\xe9mpt": "hi"}'),
    Case("lone surrogate escape", C, b'{"prompt": "\\udc00", "max_tokens": 2}'),
    Case("NaN max_tokens", C, b'{"prompt": "hi", "max_tokens": NaN}', param="max_tokens"),
    Case("Infinity top_p", H, b'{"messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}', param="top_p"),
    Case("-Infinity temperature", C, b'{"prompt": "hi", "temperature": -Infinity}', param="temperature"),
    Case("duplicate key, last invalid", C, b'{"prompt": "hi", "prompt": 5}', param="prompt"),
    Case("deep nesting", C, b'{"prompt": "hi", "stop": ' + b"[" * 200 + b"]" * 200 + b"}"),
    Case("huge body", C, {"prompt": "x" * (MAX_BODY + 10)}, 413),
    Case("trailing garbage", C, b'{"prompt": "hi"} extra'),
    Case("integer of 5000 digits", C, b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}"),
    Case("number overflowing a float", H, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}',
         param="temperature"),
    Case("utf-16 body without a BOM", C, '{"prompt": "hi", "max_tokens": 0}'.encode("utf-16-le")),
    # model, prompt, messages
    Case("unknown model", H, chat(model="gpt-9"), 404, "model"),
    Case("model not a string", H, chat(model=5), param="model"),
    Case("missing prompt", C, {"max_tokens": 2}, param="prompt"),
    Case("missing messages", H, {"max_tokens": 2}, param="messages"),
    Case("empty messages", H, chat(messages=[]), param="messages"),
    Case("messages not a list", H, chat(messages={"role": "user", "content": "hi"}), param="messages"),
    Case("wrong role", H, msg(role="wizard", content="hi"), param="messages[0].role"),
    Case("role missing", H, msg(content="hi"), param="messages[0].role"),
    Case("content a number", H, msg(role="user", content=5), param="messages[0].content"),
    Case("content an object", H, msg(role="user", content={"text": "hi"}), param="messages[0].content"),
    Case("content list of numbers", H, msg(role="user", content=[1, 2]), param="messages[0].content"),
    Case("text part without text", H, msg(role="user", content=[{"type": "text"}]), param="messages[0].content"),
    Case("image part on a text model", H,
         msg(role="user", content=[{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]),
         param="messages[0].content"),
    Case("missing content", H, msg(role="user"), param="messages[0]"),
    Case("assistant without content or tool_calls", H, msg(role="assistant"), param="messages[0]"),
    Case("tool message without tool_call_id", H,
         chat(messages=[*USER, {"role": "tool", "content": "4"}]), param="messages[1]"),
    Case("message a string", H, chat(messages=["hi"]), param="messages[0]"),
    Case("prompt empty string", C, comp(prompt=""), param="prompt"),
    Case("prompt token id out of vocab", C, comp(prompt=[1, 10**9]), param="prompt"),
    Case("prompt negative token id", C, comp(prompt=[1, -1]), param="prompt"),
    Case("prompt nested three deep", C, comp(prompt=[[[1]]]), param="prompt"),
    Case("prompt mixed list", C, comp(prompt=[1, "a"]), param="prompt"),
    Case("prompt a number", C, comp(prompt=7), param="prompt"),
    # max_tokens and the context
    Case("max_tokens 0", C, comp(max_tokens=0), param="max_tokens"),
    Case("max_tokens negative", H, chat(max_tokens=-5), param="max_tokens"),
    Case("max_tokens huge", C, comp(max_tokens=10**12), param="max_tokens"),
    Case("max_tokens a string", C, comp(max_tokens="10"), param="max_tokens"),
    Case("max_tokens a float", H, chat(max_tokens=1.5), param="max_tokens"),
    Case("max_completion_tokens 0", H, chat(max_completion_tokens=0), param="max_completion_tokens"),
    Case("prompt over the context", C, comp(prompt=[5] * 4096), param="prompt"),
    Case("echo with max_tokens 0", C, comp(echo=True, max_tokens=0)),
    # sampling parameters
    Case("temperature negative", H, chat(temperature=-1), param="temperature"),
    Case("temperature over 2", H, chat(temperature=50), param="temperature"),
    Case("temperature a string", C, comp(temperature="hot"), param="temperature"),
    Case("top_p 0", H, chat(top_p=0), param="top_p"),
    Case("top_p over 1", C, comp(top_p=1.01), param="top_p"),
    Case("top_k below -1", C, comp(top_k=-7), param="top_k"),
    Case("top_k a float", C, comp(top_k=2.5), param="top_k"),
    Case("min_p over 1", H, chat(min_p=1.5), param="min_p"),
    Case("min_p a string", H, chat(min_p="low"), param="min_p"),
    Case("presence_penalty out of range", H, chat(presence_penalty=5), param="presence_penalty"),
    Case("frequency_penalty a string", C, comp(frequency_penalty="x"), param="frequency_penalty"),
    Case("repetition_penalty 0", C, comp(repetition_penalty=0), param="repetition_penalty"),
    Case("n 0", H, chat(n=0), param="n"),
    Case("n huge", C, comp(n=10**6), param="n"),
    Case("best_of below n", C, comp(n=2, best_of=1), param="best_of"),
    Case("logprobs out of range", C, comp(logprobs=99), param="logprobs"),
    Case("top_logprobs out of range", H, chat(logprobs=True, top_logprobs=99), param="top_logprobs"),
    Case("top_logprobs without logprobs", H, chat(top_logprobs=2), param="top_logprobs"),
    Case("logit_bias key not a token id", H, chat(logit_bias={"abc": 1}), param="logit_bias"),
    Case("logit_bias value out of range", C, comp(logit_bias={"5": 500}), param="logit_bias"),
    Case("logit_bias value a string", C, comp(logit_bias={"5": "x"}), param="logit_bias"),
    Case("too many stop strings", H, chat(stop=[str(i) for i in range(20)]), param="stop"),
    Case("stop with a number", C, comp(stop=["a", 3]), param="stop"),
    Case("stop an empty string", C, comp(stop=""), param="stop"),
    Case("seed too big", H, chat(seed=2**70), param="seed"),
    Case("seed a string", C, comp(seed="7"), param="seed"),
    Case("stream not a bool", H, chat(stream="yes"), param="stream"),
    Case("stream_options without stream", H, chat(stream_options={"include_usage": True}), param="stream_options"),
    Case("stream_options not an object", H, chat(stream=True, stream_options=5), param="stream_options"),
    Case("timeout negative", C, comp(timeout=-1), param="timeout"),
    # response_format, tools
    Case("response_format json_schema", H, chat(response_format={"type": "json_schema", "json_schema": {}}),
         param="response_format"),
    Case("response_format a string", H, chat(response_format="json"), param="response_format"),
    Case("response_format unknown type", H, chat(response_format={"type": "yaml"}), param="response_format"),
    Case("tools not a list", H, chat(tools={"type": "function"}), param="tools"),
    Case("tool a string", H, chat(tools=["get_weather"]), param="tools"),
    Case("tool without function", H, chat(tools=[{"type": "function"}]), param="tools"),
    Case("tool function without name", H, chat(tools=[{"type": "function", "function": {"description": "x"}}]),
         param="tools"),
    Case("tool_choice without tools", H, chat(tool_choice="auto"), param="tool_choice"),
    Case("tool_choice a number", H, chat(tool_choice=3), param="tool_choice"),
    Case("tool_choice unknown string", H, chat(tool_choice="sometimes"), param="tool_choice"),
    Case("tool_choice forcing a function not in tools", H,
         chat(tools=[{"type": "function", "function": {"name": "f"}}],
              tool_choice={"type": "function", "function": {"name": "g"}}), param="tool_choice"),
    # routes and methods
    Case("GET on a POST route", C, None, 405, method="GET"),
    Case("PUT on a POST route", H, chat(), 405, method="PUT"),
    Case("POST on a GET route", "/v1/models", {}, 405),
    Case("unknown route", "/v1/engines", None, 404, method="GET"),
    Case("trailing slash", H + "/", chat(), 404),
    Case("very long unknown path", "/v1/" + "a" * 50_000, None, 404, method="GET"),
    Case("unknown model card", "/v1/models/gpt-9", None, 404, "model", method="GET"),
    Case("huge header", C, comp(), 431, headers={"X-Big": "a" * 40_000}),
    Case("header value of 200 KiB", C, comp(), 431, headers={"X-Big": "a" * 200 * 1024}),
]


@pytest.fixture(scope="module")
def base_url(engine: AsyncEngine) -> Iterator[str]:
    cfg = ServerConfig(port=0, max_request_body_bytes=MAX_BODY, response_cache_size=16, request_body_timeout=1.0)
    with serve(make_state(engine, cfg)) as srv:
        yield srv.base_url


def check_error(status: int, headers: Any, body: bytes, expected: int | tuple[int, ...], param: str | None) -> None:
    assert status in (expected if isinstance(expected, tuple) else (expected,)), (status, body[:300])
    assert headers["content-type"].startswith("application/json"), (headers["content-type"], body[:300])
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"] and err["type"] == "invalid_request_error", err
    if param is not None:  # the field, or a part of it ("logit_bias.5", "tools[0]")
        assert err["param"] == param or err["param"].startswith((param + ".", param + "[")), err


def test_the_table_is_big_enough() -> None:
    assert len(CASES) >= 40 and len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_malformed_request_gets_a_json_4xx(base_url: str, case: Case) -> None:
    headers = {**JSON_CT, **(case.headers or {})}
    content = case.body if isinstance(case.body, bytes) or case.body is None else json.dumps(case.body).encode()
    with httpx.Client(base_url=base_url, timeout=10) as http:
        resp = http.request(case.method, case.path, content=content, headers=headers)
        check_error(resp.status_code, resp.headers, resp.content, case.status, case.param)
        if case.path in (C, H):  # every answer of a completion route says what the response cache did
            assert resp.headers.get("x-kvstrata-cache") == "bypass", resp.headers
        assert http.get("/health").status_code == 200  # the connection (or a new one) still serves
        assert len(resp.content) < 4096  # nothing echoed back in bulk


def raw(base_url: str, request: bytes, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Send bytes as they are; read one response up to its Content-Length (or the close)."""
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"the server closed without a response: {data!r}"
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "-1"))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        return int(lines[0].split()[1]), headers, body[:length] if length >= 0 else body


def post(path: str, body: bytes, length: int | None = None, extra: bytes = b"") -> bytes:
    n = len(body) if length is None else length
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n"
            ).encode() + extra + b"\r\n" + body


RAW_CASES = [
    ("content-length longer than the body", post(C, b'{"prompt": "hi"}', length=500), 408),
    ("content-length shorter than the body", post(C, b'{"prompt": "hi", "max_tokens": 2}', length=10), 400),
    ("content-length not a number", post(C, b"{}", extra=b"Content-Length: abc\r\n"), 400),
    ("broken request line", b"POST\r\n\r\n", 400),
    ("bad chunk framing", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n", 400),
    ("both Content-Length and chunked", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    ("HTTP/2 preface on HTTP/1.1", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", (400, 404, 405)),
    ("header without a colon", b"GET /v1/models HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", 400),
    ("header over the parser's limit", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (300 * 1024)
     + b"\r\n\r\n", 431),
    ("header value of 128 KiB", post(C, b"{}", extra=b"X-Big: " + b"b" * (128 * 1024) + b"\r\n"), 431),
]


@pytest.mark.parametrize("request_bytes, status", [c[1:] for c in RAW_CASES], ids=[c[0] for c in RAW_CASES])
def test_malformed_http_gets_a_json_4xx(base_url: str, request_bytes: bytes, status: int) -> None:
    got, headers, body = raw(base_url, request_bytes)
    check_error(got, headers, body, status, None)


@pytest.mark.parametrize("upgrade", [b"websocket", b"h2c"])
def test_an_upgrade_is_served_as_plain_http(base_url: str, upgrade: bytes) -> None:
    """No WebSocket route and no WebSocket library loaded: the request is answered, never switched."""
    head = (b"Connection: Upgrade\r\nUpgrade: " + upgrade + b"\r\nSec-WebSocket-Version: 13\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n")
    status, _, body = raw(base_url, b"GET /health HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n")
    assert status == 200, body
    status, headers, body = raw(base_url, post(C, b'{"prompt": "hi", "max_tokens": -1}', extra=head))
    check_error(status, headers, body, 400, "max_tokens")


def test_accepted_on_purpose(base_url: str) -> None:
    """Not errors: unknown fields, a missing model, and a duplicate key whose last value is valid."""
    with httpx.Client(base_url=base_url, timeout=30) as http:
        assert http.post(H, json=chat(some_vendor_field={"x": 1})).status_code == 200
        assert http.post(C, json=comp()).status_code == 200
        dup = b'{"prompt": 5, "prompt": "hi", "max_tokens": 1}'
        assert http.post(C, content=dup, headers=JSON_CT).status_code == 200
