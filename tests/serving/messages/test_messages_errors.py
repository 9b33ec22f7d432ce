"""messages/errors.py: every error of the Messages routes in Anthropic's shape and statuses."""
from __future__ import annotations

import json

import pytest

from kvstrata.serving.errors import error_body
from kvstrata.serving.messages.errors import anthropic_error, rewrite


@pytest.mark.parametrize("status, code, want_status, want_type", [
    (400, "invalid_value", 400, "invalid_request_error"),
    (401, "invalid_api_key", 401, "authentication_error"),
    (404, "model_not_found", 404, "not_found_error"),
    (408, "timeout", 408, "timeout_error"),
    (413, None, 413, "request_too_large"),
    (429, "overloaded", 529, "overloaded_error"),  # a full queue sheds load
    (429, "rate_limited", 429, "rate_limit_error"),
    (503, "draining", 529, "overloaded_error"),
    (500, "internal_error", 500, "api_error"),
])
def test_statuses_and_types(status: int, code: str | None, want_status: int, want_type: str) -> None:
    got_status, body = anthropic_error(status, "why", code)
    assert (got_status, body) == (want_status, {"type": "error", "error": {"type": want_type, "message": "why"}})


def test_an_openai_body_is_rewritten_and_any_other_body_kept_as_the_message() -> None:
    status, body = rewrite(429, json.dumps(error_body("queue full", "rate_limit_error", None, "overloaded")).encode())
    assert status == 529 and json.loads(body) == {"type": "error", "error": {"type": "overloaded_error",
                                                                             "message": "queue full"}}
    status, body = rewrite(502, b"bad gateway")
    assert status == 502 and json.loads(body)["error"] == {"type": "api_error", "message": "bad gateway"}
