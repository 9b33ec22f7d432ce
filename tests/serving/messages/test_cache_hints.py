"""messages/cache_hints.py: the session id Claude Code sends, and where its cache_control breakpoints are."""
from __future__ import annotations

import pytest

from kvstrata.engine.sampling_params import InvalidRequestError
from kvstrata.serving.messages.cache_hints import Breakpoint, breakpoint_of, session_key
from kvstrata.serving.messages.request import MessagesRequest


def test_the_header_wins_then_metadata_user_id() -> None:
    meta = {"user_id": '{"device_id": "d", "session_id": "from-meta"}'}
    assert session_key({"x-claude-code-session-id": "from-header"}, meta) == "from-header"
    assert session_key({}, meta) == "from-meta"
    assert session_key({}, {"user_id": "user_abc_account__session_1f2e-99"}) == "1f2e-99"
    assert session_key({}, {"user_id": "plain-user"}) is None
    assert session_key({}, None) is None
    assert len(session_key({"x-claude-code-session-id": "s" * 5000}, None) or "") == 1024


def _req(**fields: object) -> MessagesRequest:
    return MessagesRequest.model_validate({"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], **fields})


EPH = {"type": "ephemeral"}


def test_the_last_breakpoint_and_the_longest_ttl() -> None:
    assert breakpoint_of(_req(), [1], False) is None
    assert breakpoint_of(_req(system=[{"type": "text", "text": "s", "cache_control": EPH}]), [2], True) == \
        Breakpoint(1, "5m")
    tools = [{"name": "f", "input_schema": {}, "cache_control": {**EPH, "ttl": "1h"}}]
    assert breakpoint_of(_req(tools=tools, system="s"), [2], True) == Breakpoint(1, "1h")
    assert breakpoint_of(_req(tools=tools), [1], False) is None  # no system message to end at
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"},
                                          {"type": "text", "text": "c", "cache_control": EPH}]}]
    assert breakpoint_of(_req(messages=turns, tools=tools, system="s"), [2, 3, 5], True) == Breakpoint(5, "1h")
    assert breakpoint_of(_req(cache_control=EPH), [1], False) == Breakpoint(1, "5m")  # automatic: after the last


def test_a_bad_cache_control_is_a_400_naming_it() -> None:
    for bad, param in (({"type": "persistent"}, "system[0].cache_control"),
                       ({**EPH, "ttl": "2d"}, "system[0].cache_control.ttl")):
        with pytest.raises(InvalidRequestError) as info:
            breakpoint_of(_req(system=[{"type": "text", "text": "s", "cache_control": bad}]), [2], True)
        assert info.value.param == param
