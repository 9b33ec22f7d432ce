"""messages/output.py: content blocks of a finished reply, stop_reason, usage in Anthropic's meaning."""
from __future__ import annotations

from kvstrata.serving.messages.output import Usage, reply_blocks, signature, stop_reason, tool_input
from kvstrata.serving.tool_calls.formats import FORMATS

HERMES = FORMATS["hermes"]


def test_usage_splits_the_prompt_into_three_disjoint_parts() -> None:
    assert Usage(100, 0, 5).body() == {"input_tokens": 100, "cache_creation_input_tokens": 0,
                                       "cache_read_input_tokens": 0, "output_tokens": 5}
    # 80 tokens up to the breakpoint, 32 of them read: 48 written, 20 after the breakpoint
    assert Usage(100, 32, 5, breakpoint_tokens=80).body() == {
        "input_tokens": 20, "cache_creation_input_tokens": 48, "cache_read_input_tokens": 32, "output_tokens": 5}
    # a hit past the breakpoint writes nothing
    assert Usage(100, 96, 1, breakpoint_tokens=80).body()["cache_creation_input_tokens"] == 0
    for u in (Usage(100, 32, 5, 80), Usage(10, 0, 1, 80), Usage(100, 96, 1, 80)):
        b = u.body()
        assert b["input_tokens"] + b["cache_creation_input_tokens"] + b["cache_read_input_tokens"] == u.prompt_tokens
        assert min(b.values()) >= 0


def test_stop_reason_names_why_the_reply_ended() -> None:
    assert stop_reason(None, None, False) is None
    assert stop_reason("stop", None, False) == "end_turn"
    assert stop_reason("stop", "###", False) == "stop_sequence"
    assert stop_reason("length", None, False) == "max_tokens"
    assert stop_reason("stop", None, True) == "tool_use"


def test_tool_input_is_the_argument_object() -> None:
    assert tool_input('{"city": "Paris"}') == {"city": "Paris"}
    assert tool_input("") == {}
    assert tool_input("[1, 2]") == {"raw": "[1, 2]"}
    assert tool_input('{"city": "Par') == {"raw": '{"city": "Par'}


def test_blocks_are_thinking_then_text_then_tool_uses() -> None:
    reply = '<think>\nRain or sun?\n</think>\n\nLet me look.\n<tool_call>\n{"name": "get_weather", ' \
            '"arguments": {"city": "Oslo"}}\n</tool_call>'
    blocks, called = reply_blocks("qwen3", HERMES, reply)
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"] and called
    assert blocks[0]["thinking"].strip() == "Rain or sun?" and blocks[0]["signature"] == signature(blocks[0]["thinking"])
    assert blocks[1]["text"] == "Let me look."
    assert blocks[2]["name"] == "get_weather" and blocks[2]["input"] == {"city": "Oslo"}
    assert blocks[2]["id"].startswith("toolu_")


def test_without_parsers_the_reply_is_one_text_block() -> None:
    assert reply_blocks(None, None, "<think>x</think> hi") == ([{"type": "text", "text": "<think>x</think> hi"}], False)
    assert reply_blocks(None, None, "") == ([], False)
