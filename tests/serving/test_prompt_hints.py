"""prompt_cache_key and prompt_cache_retention: validated (400 naming the field), recorded in the
request stats line and the --log-requests log, and sent by the real openai client."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest

from kvstrata.config_server import ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from serving_support import USER, assert_error, make_state, openai_client, serve

CHAT = ("/v1/chat/completions", {"messages": USER, "max_tokens": 1})
COMP = ("/v1/completions", {"prompt": "hi", "max_tokens": 1})


@pytest.mark.parametrize("route", [CHAT, COMP], ids=["chat", "completions"])
@pytest.mark.parametrize(
    "fields, param",
    [
        ({"prompt_cache_key": "k" * 1025}, "prompt_cache_key"),
        ({"prompt_cache_key": 7}, "prompt_cache_key"),
        ({"prompt_cache_key": ["a"]}, "prompt_cache_key"),
        ({"prompt_cache_retention": "1h"}, "prompt_cache_retention"),
        ({"prompt_cache_retention": 24}, "prompt_cache_retention"),
        ({"prompt_cache_retention": ""}, "prompt_cache_retention"),
    ],
)
def test_bad_hint_is_a_400_naming_the_field(http: httpx.Client, route: tuple, fields: dict, param: str) -> None:
    path, body = route
    assert_error(http.post(path, json={**body, **fields}), 400, param)


@pytest.mark.parametrize("route", [CHAT, COMP], ids=["chat", "completions"])
def test_good_hints_are_accepted(http: httpx.Client, route: tuple) -> None:
    path, body = route
    for fields in ({"prompt_cache_key": "k" * 1024, "prompt_cache_retention": "24h"},
                   {"prompt_cache_key": "", "prompt_cache_retention": "in_memory"}, {"prompt_cache_retention": None}):
        assert http.post(path, json={**body, **fields}).status_code == 200, fields


def test_openai_client_sends_both_hints_typed_and_extra_body(
    engine: AsyncEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "req.jsonl"
    cfg = ServerConfig(port=0, log_requests=str(log), enable_log_request_stats=True)
    state = make_state(engine, cfg)
    with caplog.at_level(logging.INFO, logger="kvstrata.request_stats"), serve(state) as srv:
        client = openai_client(srv)
        model = engine.served_model_name
        # typed parameters: the pinned openai client has both on chat.completions.create
        client.chat.completions.create(model=model, messages=USER, max_tokens=1,  # type: ignore[arg-type]
                                       prompt_cache_key="session-typed", prompt_cache_retention="24h")
        client.chat.completions.create(model=model, messages=USER, max_tokens=1,  # type: ignore[arg-type]
                                       extra_body={"prompt_cache_key": "session-extra", "prompt_cache_retention": "24h"})
        client.completions.create(model=model, prompt="hi", max_tokens=1,
                                  extra_body={"prompt_cache_key": "session-comp", "prompt_cache_retention": "in_memory"})
        with pytest.raises(Exception) as bad:  # the client surfaces the 400
            client.chat.completions.create(model=model, messages=USER, max_tokens=1,  # type: ignore[arg-type]
                                           extra_body={"prompt_cache_retention": "7d"})
        assert getattr(bad.value, "status_code", None) == 400 and "prompt_cache_retention" in str(bad.value)
    state.request_log.close()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line.get("prompt_cache_key") for line in lines] == ["session-typed", "session-extra", "session-comp"]
    assert lines[0]["body"]["prompt_cache_retention"] == "24h"
    stats = [r.getMessage() for r in caplog.records if r.getMessage().startswith("request_stats")]
    assert any('prompt_cache_key="session-typed"' in s and "retention=24h" in s for s in stats), stats
    assert any('prompt_cache_key="session-comp"' in s and "retention=in_memory" in s for s in stats), stats
