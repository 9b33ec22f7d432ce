"""Tool-call parsers per family, on model outputs, streamed (cut at every character) and not.

The SmolLM2 outputs were recorded from `kvstrata serve` (float32, greedy; the json fallback);
the Hermes/Qwen and Llama-3 ones are written in those families' documented output formats.
"""
from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    """A named call cut by max_tokens stays a call, with its arguments cut and the engine's reason,
    streamed or not (as OpenAI answers)."""
    text = '<tool_call>\n{"name": "a", "arguments": {"x": 1'
    message, reason = chat_message(FORMATS["hermes"], text, "length")
    assert reason == "length" and message["content"] is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [("a", '{"x": 1')]
    _, calls, _, _ = _stream("hermes", list(text))
    stream = ToolCallStream(FORMATS["hermes"])
    stream.feed(text, True)
    assert stream.finish_reason("length") == "length"
    assert (calls[0]["name"], calls[0]["arguments"]) == ("a", '{"x": 1')


# replies where streamed and whole answers once disagreed, and other edges of the rules
EDGES = [
    ("json", '{"name":"f","arguments":{}} Done'),  # a call, then content
    ("json", '  {"name": "f", "arguments": {"a": [1, {"b": "}"}]}}{"name": "g", "arguments": {}}'),
    ("json", '{"name": "f", "arguments": {}, "extra": 1}'),  # named, then not a call
    ("json", '{"arguments": {"q": "\\"}, "name": "late"}'),  # an escaped quote: the string never ends
    ("json", '{"arguments": {"q": 1}, "name": "late"}'),  # the arguments before the name
    ("json", '{"name": 5, "arguments": {}}'),
    ("json", '{"name": "f", "arguments": [1]}'),
    ("json", '{"name": "f", "arguments": {"a": ]}'),
    ("json", "   "),
    ("hermes", 'Hi <tool_call>\n{"name": "a", "arguments": {}}\n</tool_call> bye <tool_call>{"name": "b", '
               '"arguments": {"k": "v"}}</tool_call>'),
    ("hermes", '<tool_call>\n{"nope": 1}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_c'),
    ("hermes", "text <tool_ca"),
    ("hermes", "<tool_call>"),
    ("llama3_json", '<|python_tag|>{"name": "a", "parameters": {}}; nothing'),
    ("llama3_json", '<|python_ta'),
    ("llama3_json", '{"name": "a", "parameters": {"s": "x\\"y"}};{"name": "b", "parameters": {}}'),
]
ALL = [(fmt, text) for fmt, text, _, _ in OUTPUTS] + EDGES


@pytest.mark.parametrize("fmt, text", ALL)
@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_streamed_and_whole_replies_agree_wherever_the_stream_is_cut(fmt: str, text: str, cuts: list[int]) -> None:
    for reason in ("stop", "length"):
        message, whole_reason = chat_message(FORMATS[fmt], text, reason)
        bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
        pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])] or [""]
        content, calls, _, _ = _stream(fmt, pieces)
        stream = ToolCallStream(FORMATS[fmt])
        for k, piece in enumerate(pieces):
            stream.feed(piece, k == len(pieces) - 1)
        assert stream.finish_reason(reason) == whole_reason
        want = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
        assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == want
        assert (content.strip() or None if want else content) == message["content"]


def test_the_issues_reply_is_a_call_then_content() -> None:
    message, reason = chat_message(FORMATS["json"], '{"name":"f","arguments":{}} Done', "stop")
    assert reason == "tool_calls" and message["content"] == "Done"
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}


def test_a_long_call_streamed_a_character_at_a_time_reads_each_once() -> None:
    """100 KB of arguments in 1-character deltas: re-parsing the whole reply per delta (as before)
    is ~5e9 character steps (hours); reading only what is new takes about a second."""
    text = '{"name": "f", "arguments": {"s": "' + 'a\\"[{' * 20_000 + '"}}'
    stream = ToolCallStream(FORMATS["json"])
    started = time.perf_counter()
    for k in range(len(text)):
        stream.feed(text[k], k == len(text) - 1)
    assert time.perf_counter() - started < 60.0
    assert stream.parser.calls[0].arguments == text[len('{"name": "f", "arguments": '):-1]
    assert stream.finish_reason("stop") == "tool_calls"


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
