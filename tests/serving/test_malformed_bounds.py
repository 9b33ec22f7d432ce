"""The bounded request surface: every field a client sends is honoured or refused with a 400 naming
it. Limits on what the engine keeps per request (cache_salt, stop strings, stop_token_ids) and a
seed that would overflow for a later choice, refused before any choice starts."""
from __future__ import annotations

import json
from typing import Iterator

import httpx
import pytest

from kvstrata.config_server import ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.engine.sampling_params import MAX_SEED, MAX_STOP_STRING_CHARS, MAX_STOP_TOKEN_IDS
from kvstrata.serving.sampling_request import MAX_CACHE_SALT_CHARS
from serving_support import RecordingEngine, make_state, serve
from test_malformed import JSON_CT, Case, C, H, chat, check_error, comp

CASES = [
    Case("cache_salt too long", H, chat(cache_salt="s" * (MAX_CACHE_SALT_CHARS + 1)), param="cache_salt"),
    Case("cache_salt too long (completions)", C, comp(cache_salt="s" * (MAX_CACHE_SALT_CHARS + 1)), param="cache_salt"),
    Case("too many stop_token_ids", H, chat(stop_token_ids=[5] * (MAX_STOP_TOKEN_IDS + 1)), param="stop_token_ids"),
    Case("stop string too long", C, comp(stop="x" * (MAX_STOP_STRING_CHARS + 1)), param="stop"),
    Case("one of the stop strings too long", H, chat(stop=["a", "y" * (MAX_STOP_STRING_CHARS + 1)]), param="stop"),
    Case("seed max with n 2", H, chat(seed=MAX_SEED, n=2), param="seed"),
    Case("seed max-2 with n 4", C, comp(seed=MAX_SEED - 2, n=4), param="seed"),
]


@pytest.fixture(scope="module")
def recorder(engine: AsyncEngine) -> RecordingEngine:
    return RecordingEngine(engine)


@pytest.fixture(scope="module")
def base_url(recorder: RecordingEngine) -> Iterator[str]:
    with serve(make_state(recorder, ServerConfig(port=0, response_cache_size=16))) as srv:
        yield srv.base_url


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_unbounded_field_gets_a_400_naming_it(base_url: str, case: Case, recorder: RecordingEngine) -> None:
    with httpx.Client(base_url=base_url, timeout=10) as http:
        resp = http.post(case.path, content=json.dumps(case.body).encode(), headers=JSON_CT)
        check_error(resp.status_code, resp.headers, resp.content, case.status, case.param)
    assert recorder.ended == {}  # refused before any choice reached the engine


def test_limits_themselves_are_accepted(base_url: str) -> None:
    ok = [
        chat(cache_salt="s" * MAX_CACHE_SALT_CHARS),
        chat(stop_token_ids=[5] * MAX_STOP_TOKEN_IDS),
        chat(stop="x" * MAX_STOP_STRING_CHARS),
        chat(seed=MAX_SEED - 1, n=2, temperature=1.0),
        chat(seed=MAX_SEED, n=1, temperature=1.0),
    ]
    with httpx.Client(base_url=base_url, timeout=30) as http:
        for body in ok:
            assert http.post(H, json=body).status_code == 200, body
