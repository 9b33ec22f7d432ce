"""Tool calls in Chat Completions answers: the whole message, or OpenAI's streamed deltas.

Non-streamed: `message.tool_calls` (each with an id, `type: "function"`, the name and the raw
argument text) and `finish_reason: "tool_calls"`. Streamed: for each call, first a delta with its
index, id, type and name (arguments ""), then argument fragments; their concatenation is the
final argument text. Both read the reply with the same `ToolCallParser` (parser.py), so a reply
has the same calls and content streamed or not; a reply that is not calls is content.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from kvstrata.serving.tool_calls.formats import ToolCallFormat
from kvstrata.serving.tool_calls.parser import PartialCall, ToolCallParser


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_call_body(name: str, arguments: str, id_: str | None = None) -> dict[str, Any]:
    return {"id": id_ or call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def whole_reply(fmt: ToolCallFormat, text: str) -> tuple[str, list[PartialCall], bool]:
    """(content, calls, whether every call is whole) of a finished reply."""
    parser = ToolCallParser(fmt)
    content = parser.feed(text, final=True)
    return content, parser.calls, parser.complete


def finish_reason(complete: bool, engine_reason: str | None) -> str | None:
    """"tool_calls" once the reply ended with whole calls; otherwise the engine's (length, stop)."""
    return "tool_calls" if engine_reason is not None and complete else engine_reason


def chat_message(fmt: ToolCallFormat, text: str, engine_reason: str | None) -> tuple[dict[str, Any], str | None]:
    """(message, finish_reason) of a finished choice."""
    content, calls, complete = whole_reply(fmt, text)
    if not calls:
        return {"role": "assistant", "content": content}, engine_reason
    bodies = [tool_call_body(c.name, c.arguments) for c in calls]
    return {"role": "assistant", "content": content.strip() or None, "tool_calls": bodies}, \
        finish_reason(complete, engine_reason)


@dataclass
class ToolCallStream:
    """One streamed choice: text in, (content delta, tool_call deltas) out."""

    fmt: ToolCallFormat
    parser: ToolCallParser = field(init=False)
    ids: list[str] = field(default_factory=list)
    args_sent: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.parser = ToolCallParser(self.fmt)

    @property
    def called(self) -> bool:
        return bool(self.ids)

    def feed(self, new_text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        content = self.parser.feed(new_text, final)
        deltas: list[dict[str, Any]] = []
        for k, call in enumerate(self.parser.calls):
            if k == len(self.ids):
                self.ids.append(call_id())
                self.args_sent.append(0)
                deltas.append({"index": k, **tool_call_body(call.name, "", self.ids[k])})
            fragment = call.arguments[self.args_sent[k]:]
            if fragment:
                self.args_sent[k] = len(call.arguments)
                deltas.append({"index": k, "function": {"arguments": fragment}})
        return content, deltas

    def finish_reason(self, engine_reason: str | None) -> str | None:
        return finish_reason(self.parser.complete, engine_reason)


def stream_delta(
    streams: dict[int, ToolCallStream], fmt: ToolCallFormat, index: int, text: str, reason: str | None
) -> tuple[str, list[dict[str, Any]], str | None]:
    """(content delta, tool_call deltas, finish reason) of one engine output of choice `index`."""
    stream = streams.setdefault(index, ToolCallStream(fmt))
    content, calls = stream.feed(text, reason is not None)
    return content, calls, stream.finish_reason(reason)
