"""Tool-call parsers per family, on model outputs, streamed (cut at every character) and not.

The SmolLM2 outputs were recorded from `kvstrata serve` (float32, greedy; the json fallback);
the Hermes/Qwen and Llama-3 ones are written in those families' documented output formats.
"""
from __future__ import annotations

import json
from typing import Any

import pytest

from kvstrata.serving.tool_calls.formats import FORMATS, pick_format
from kvstrata.serving.tool_calls.output import ToolCallStream, chat_message

# (format, model output, expected content, expected [(name, arguments)])
OUTPUTS = [
    ("json", '{"name": "get_weather", "arguments": {"city": "Paris"}}', None, [("get_weather", '{"city": "Paris"}')]),
    ("json", '{"name": "add", "arguments": {"a": 10, "b": 20}}', None, [("add", '{"a": 10, "b": 20}')]),
    ("json", 'The weather in Paris is mild.', "The weather in Paris is mild.", []),
    ("json", '{"answer": 42}', '{"answer": 42}', []),  # JSON, but not a call
    ("json", '{"name": "f", "arguments": {"s": "a } \\" {"}}', None, [("f", '{"s": "a } \\" {"}')]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', None,
     [("get_weather", '{"city": "Paris"}')]),
    ("hermes", 'Let me check both.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
     '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>', "Let me check both.", [("a", '{"x": 1}'), ("b", "{}")]),
    ("hermes", "No tools needed: 4 < 5.", "No tools needed: 4 < 5.", []),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', None,
     [("get_weather", '{"city": "Paris"}')]),
    ("llama3_json", '<|python_tag|>{"name": "a", "parameters": {"q": "x"}}; {"name": "b", "parameters": {}}', None,
     [("a", '{"q": "x"}'), ("b", "{}")]),
]


@pytest.mark.parametrize("fmt, text, content, calls", OUTPUTS)
def test_whole_reply(fmt: str, text: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    message, reason = chat_message(FORMATS[fmt], text, "stop")
    got = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    assert got == calls
    assert message["content"] == content
    assert reason == ("tool_calls" if calls else "stop")
    ids = [c["id"] for c in message.get("tool_calls", [])]
    assert len(set(ids)) == len(ids) and all(i.startswith("call_") for i in ids)
    for _, arguments in calls:
        json.loads(arguments)


def _stream(fmt: str, pieces: list[str]) -> tuple[str, dict[int, dict[str, Any]], str | None, list[dict[str, Any]]]:
    stream = ToolCallStream(FORMATS[fmt])
    content, calls, deltas = "", {}, []
    for k, piece in enumerate(pieces):
        last = k == len(pieces) - 1
        text, tool_deltas = stream.feed(piece, last)
        content += text
        for d in tool_deltas:
            deltas.append(d)
            call = calls.setdefault(d["index"], {"id": None, "name": None, "arguments": ""})
            if "id" in d:  # the first delta of a call: id, type, name
                assert call["id"] is None and d["type"] == "function" and d["function"]["arguments"] == ""
                call["id"], call["name"] = d["id"], d["function"]["name"]
            call["arguments"] += d["function"].get("arguments", "")
    return content, calls, stream.finish_reason("stop"), deltas


@pytest.mark.parametrize("fmt, text, content, calls", OUTPUTS)
@pytest.mark.parametrize("cut", [1, 3, 7])
def test_streamed_reply(fmt: str, text: str, content: str | None, calls: list[tuple[str, str]], cut: int) -> None:
    pieces = [text[i:i + cut] for i in range(0, len(text), cut)]
    got_content, got_calls, reason, deltas = _stream(fmt, pieces)
    assert [(c["name"], c["arguments"]) for _, c in sorted(got_calls.items())] == calls
    assert reason == ("tool_calls" if calls else "stop")
    if calls:
        assert got_content.strip() == (content or "")
        # OpenAI's order: a call's header before its fragments, calls one after the other
        assert [d["index"] for d in deltas] == sorted(d["index"] for d in deltas)
    else:
        assert got_content == text  # everything held back comes out as content in the end


def test_a_call_cut_by_max_tokens() -> None:
    """Not a call when whole (content, the engine's finish reason); streamed, what was sent stays sent."""
    text = '<tool_call>\n{"name": "a", "arguments": {"x": 1'
    assert chat_message(FORMATS["hermes"], text, "length") == ({"role": "assistant", "content": text}, "length")
    _, calls, _, _ = _stream("hermes", list(text))
    stream = ToolCallStream(FORMATS["hermes"])
    stream.feed(text, False)
    assert stream.finish_reason("length") == "length"
    assert calls[0]["name"] == "a" and '{"x": 1'.startswith(calls[0]["arguments"])


def test_content_streams_before_the_call() -> None:
    stream = ToolCallStream(FORMATS["hermes"])
    assert stream.feed("Let me look", False) == ("Let me look", [])
    assert stream.feed(" that up.\n<tool", False) == (" that up.\n", [])  # a marker's beginning is held back
    assert stream.feed('_call>\n{"name": "f", "arguments": {"x"', False)[1][0]["function"]["name"] == "f"


@pytest.mark.parametrize("template, expected", [
    ("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}", "json"),  # SmolLM2's: no tool syntax
    ("{% if tools %}<tools>{{ tools }}</tools>{% endif %}<tool_call>", "hermes"),  # Qwen2.5/Hermes
    ('{% if tools %}"parameters"{% endif %}<|eot_id|><|python_tag|>', "llama3_json"),  # Llama 3.1
    (None, "json"),
])
def test_auto_picks_from_the_template(template: str | None, expected: str) -> None:
    assert pick_format("auto", template).name == expected
    assert pick_format("hermes", template).name == "hermes"
