"""Error bodies quote at most a short prefix of what the client sent (serving/errors.py `quote`,
and the cut in `error_body`): a 1 MB id, name or model never comes back in bulk."""
from __future__ import annotations

from typing import Any

import httpx
import pytest

from kvstrata.serving.errors import MAX_MESSAGE_CHARS, QUOTE_CHARS, error_body, quote
from serving_support import assert_error

HUGE = "x" * 1_000_000
MSG = [{"role": "user", "content": "hi"}]


def test_quote_cuts_long_values_and_says_how_long() -> None:
    assert quote("abc") == "'abc'"
    cut = quote(HUGE)
    assert len(cut) < QUOTE_CHARS + 40 and "1000000 characters" in cut
    assert len(quote(list(range(100_000)))) < QUOTE_CHARS + 40


def test_error_body_cuts_message_and_param() -> None:
    err = error_body("m" * 100_000, "invalid_request_error", "p" * 100_000)["error"]
    assert len(err["message"]) <= MAX_MESSAGE_CHARS + 3 and len(err["param"]) < 300


@pytest.mark.parametrize("path, body", [
    ("/v1/responses", {"input": "hi", "previous_response_id": HUGE}),
    ("/v1/responses", {"input": "hi", HUGE: 1}),
    ("/v1/responses", {"input": [{"type": HUGE}]}),
    ("/v1/chat/completions", {"messages": MSG, "model": HUGE}),
    ("/v1/chat/completions", {"messages": MSG, "tools": [{"type": "function", "function": {"name": HUGE}}]}),
    ("/v1/chat/completions", {"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": HUGE}),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": HUGE}}),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {HUGE: 1}}),
])
def test_a_megabyte_of_input_is_not_echoed(http: httpx.Client, path: str, body: dict[str, Any]) -> None:
    resp = http.post(path, json=body)
    assert 400 <= resp.status_code < 500
    assert_error(resp, resp.status_code)
    assert len(resp.content) < 2048, resp.content[:300]
