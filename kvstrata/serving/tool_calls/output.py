"""Tool calls in Chat Completions answers: the whole message, or OpenAI's streamed deltas.

Non-streamed: `message.tool_calls` (each with an id, `type: "function"`, the name and the raw
argument text) and `finish_reason: "tool_calls"`. Streamed: for each call, first a delta with its
index, id, type and name (arguments ""), then argument fragments; their concatenation is the
final argument text. A reply that turns out not to be calls is sent as content.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from kvstrata.serving.tool_calls.formats import ToolCallFormat, parse


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_call_body(name: str, arguments: str, id_: str | None = None) -> dict[str, Any]:
    return {"id": id_ or call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def chat_message(fmt: ToolCallFormat, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
    """(message, finish_reason) of a finished choice."""
    parsed = parse(fmt, text, final=True)
    if not parsed.valid or not parsed.calls:
        return {"role": "assistant", "content": text}, finish_reason
    calls = [tool_call_body(c.name or "", c.arguments) for c in parsed.calls]
    content = parsed.content.strip() or None
    return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"


@dataclass
class ToolCallStream:
    """One streamed choice: text in, (content delta, tool_call deltas) out."""

    fmt: ToolCallFormat
    text: str = ""
    content_sent: int = 0
    ids: list[str] = field(default_factory=list)
    args_sent: list[int] = field(default_factory=list)

    @property
    def called(self) -> bool:
        return bool(self.ids)

    def feed(self, new_text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        self.text += new_text
        parsed = parse(self.fmt, self.text, final)
        content = self.text if not parsed.valid else parsed.content
        if not parsed.valid and self.ids:  # calls already sent: the rest cannot become content now
            content = self.text[: self.content_sent]
        delta = content[self.content_sent:]
        self.content_sent = max(self.content_sent, len(content))
        deltas: list[dict[str, Any]] = []
        for k, call in enumerate(parsed.calls if parsed.valid else []):
            if call.name is None:
                break
            if k == len(self.ids):
                self.ids.append(call_id())
                self.args_sent.append(0)
                deltas.append({"index": k, **tool_call_body(call.name, "", self.ids[k])})
            fragment = call.arguments[self.args_sent[k]:]
            if fragment:
                self.args_sent[k] = len(call.arguments)
                deltas.append({"index": k, "function": {"arguments": fragment}})
        return delta, deltas

    def finish_reason(self, engine_reason: str | None) -> str | None:
        if engine_reason is None:
            return None
        final = parse(self.fmt, self.text, final=True)
        return "tool_calls" if self.ids and final.valid else engine_reason


def stream_delta(
    streams: dict[int, ToolCallStream], fmt: ToolCallFormat, index: int, text: str, reason: str | None
) -> tuple[str, list[dict[str, Any]], str | None]:
    """(content delta, tool_call deltas, finish reason) of one engine output of choice `index`."""
    stream = streams.setdefault(index, ToolCallStream(fmt))
    content, calls = stream.feed(text, reason is not None)
    return content, calls, stream.finish_reason(reason)
