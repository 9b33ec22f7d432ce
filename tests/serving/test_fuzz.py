"""Fuzz both completion routes from /openapi.json (schemathesis): never a 5xx, every 4xx a JSON error.

The engine here has a 64-token context, so no fuzzed request runs long; the examples are
derandomized and bounded (about 40 s in all on two cores).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any, Iterator

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from kvstrata.config import ModelConfig
from kvstrata.config_server import ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from serving_support import CACHE, SCHED, make_state, serve

KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ROUTES = ("/v1/completions", "/v1/chat/completions")
EXAMPLES = 150  # per route and mode


@pytest.fixture(scope="module")
def fuzz_target(model_cfg: ModelConfig) -> Iterator[tuple[str, Any]]:
    eng = AsyncEngine.from_config(replace(model_cfg, max_model_len=64), CACHE, SCHED)
    cfg = ServerConfig(port=0, api_key=(KEY,), response_cache_size=32)
    with serve(make_state(eng, cfg)) as srv:
        spec = httpx.get(f"{srv.base_url}/openapi.json", headers=AUTH).json()
        yield srv.base_url, schemathesis.openapi.from_dict(spec)
    eng.shutdown()


def check_error_body(resp: Any) -> None:
    """An OpenAI-style JSON error (`resp`: a requests or a schemathesis response)."""
    ctype = resp.headers.get("content-type") or resp.headers.get("Content-Type")
    ctype = ctype[0] if isinstance(ctype, list) else ctype
    assert ctype.startswith("application/json"), resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("path", ROUTES)
def test_fuzzed_requests_never_get_5xx(fuzz_target: tuple[str, Any], path: str, mode: GenerationMode) -> None:
    url, schema = fuzz_target
    statuses: Counter[int] = Counter()
    session = requests.Session()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate, Phase.shrink])
    @given(case=schema[path]["POST"].as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        resp = case.call(base_url=url, session=session, headers=AUTH, timeout=30)
        statuses[resp.status_code] += 1
        assert resp.status_code < 500, (case.body, resp.status_code, resp.text[:500])
        if resp.status_code >= 400:
            assert resp.status_code != 422  # validation errors are OpenAI's 400
            check_error_body(resp)

    run()
    assert sum(statuses.values()) >= EXAMPLES // 2, statuses
    if mode is GenerationMode.POSITIVE and path == ROUTES[0]:
        assert statuses[200] > 0, statuses  # the fuzzer reached the model, not only validation


JSON = {"Content-Type": "application/json"}
MALFORMED: list[tuple[str, dict[str, Any]]] = [
    ("empty body", {"data": b"", "headers": {"Content-Type": "application/json"}}),
    ("not json", {"data": b"{prompt: x", "headers": {"Content-Type": "application/json"}}),
    ("a json array", {"json": ["x"]}),
    ("a json string", {"json": "x"}),
    ("json null", {"data": b"null", "headers": {"Content-Type": "application/json"}}),
    ("form encoded", {"data": {"prompt": "x"}}),
    ("no prompt", {"json": {"max_tokens": 3}}),
    ("prompt null", {"json": {"prompt": None}}),
    ("prompt a number", {"json": {"prompt": 5}}),
    ("empty prompt list", {"json": {"prompt": []}}),
    ("mixed prompt list", {"json": {"prompt": ["a", 1]}}),
    ("token id out of vocab", {"json": {"prompt": [10**12]}}),
    ("negative token id", {"json": {"prompt": [-1]}}),
    ("max_tokens zero", {"json": {"prompt": "x", "max_tokens": 0}}),
    ("max_tokens a string", {"json": {"prompt": "x", "max_tokens": "3"}}),
    ("max_tokens a float", {"json": {"prompt": "x", "max_tokens": 3.5}}),
    ("temperature NaN", {"data": b'{"prompt": "x", "temperature": NaN}', "headers": JSON}),
    ("temperature negative", {"json": {"prompt": "x", "temperature": -1}}),
    ("top_p above 1", {"json": {"prompt": "x", "top_p": 2}}),
    ("n zero", {"json": {"prompt": "x", "n": 0}}),
    ("n too many", {"json": {"prompt": "x", "n": 1000}}),
    ("stop not strings", {"json": {"prompt": "x", "stop": [1, 2]}}),
    ("lone surrogate", {"data": b'{"prompt": "\\ud800"}', "headers": {"Content-Type": "application/json"}}),
    ("invalid utf-8", {"data": b'{"prompt": "\xff\xfe"}', "headers": {"Content-Type": "application/json"}}),
    ("seed out of range", {"json": {"prompt": "x", "seed": 2**64}}),
    ("deep nesting", {"data": b'{"prompt": ' + b"[" * 200 + b"]" * 200 + b"}",
                      "headers": {"Content-Type": "application/json"}}),
    ("unknown model", {"json": {"prompt": "x", "model": "gpt-4"}}),
    ("stream not bool", {"json": {"prompt": "x", "stream": "yes"}}),
    ("chat: no messages", {"json": {"messages": []}, "chat": True}),
    ("chat: bad role", {"json": {"messages": [{"role": "wizard", "content": "x"}]}, "chat": True}),
    ("chat: content a number", {"json": {"messages": [{"role": "user", "content": 5}]}, "chat": True}),
    ("chat: image part", {"json": {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
                          "chat": True}),
]


@pytest.mark.parametrize("name, request_kwargs", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_request_gets_a_4xx_json_error(fuzz_target: tuple[str, Any], name: str,
                                                 request_kwargs: dict[str, Any]) -> None:
    url, _ = fuzz_target
    kwargs = dict(request_kwargs)
    path = ROUTES[1] if kwargs.pop("chat", False) else ROUTES[0]
    resp = requests.post(f"{url}{path}", headers={**AUTH, **kwargs.pop("headers", {})}, timeout=30, **kwargs)
    assert 400 <= resp.status_code < 500 and resp.status_code != 422, (resp.status_code, resp.text)
    check_error_body(resp)
