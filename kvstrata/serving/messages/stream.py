"""The SSE events of a streamed /v1/messages answer, in Anthropic's order:

    message_start
    (content_block_start, [ping once, after the first], content_block_delta..., content_block_stop)*
    message_delta (stop_reason, stop_sequence, usage), message_stop

Deltas are `thinking_delta` (then one `signature_delta` before its block stops), `text_delta` and
`input_json_delta` (a tool_use block's argument text, piece by piece). An error after the 200 went
out is an `error` event with Anthropic's error body, which its SDK raises.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from kvstrata.engine.outputs import RequestOutput
from kvstrata.serving.errors import api_error_from
from kvstrata.serving.messages.errors import anthropic_error
from kvstrata.serving.messages.output import MessageHeader, Usage, signature, stop_reason, tool_use_id
from kvstrata.serving.reasoning import ReasoningSplitter
from kvstrata.serving.streaming import UsageTracker, raise_if_failed
from kvstrata.serving.tool_calls.formats import ToolCallFormat
from kvstrata.serving.tool_calls.output import ToolCallStream


def event(kind: str, **fields: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n"


@dataclass
class _Blocks:
    """The content blocks streamed so far: at most one open at a time."""

    index: int = -1
    kind: str | None = None  # the open block's type
    thinking: str = ""  # the open thinking block's text, for its signature
    pinged: bool = False
    out: list[str] = field(default_factory=list)

    def open(self, block: dict[str, Any]) -> None:
        self.close()
        self.index += 1
        self.kind = block["type"]
        self.out.append(event("content_block_start", index=self.index, content_block=block))
        if not self.pinged:
            self.pinged = True
            self.out.append(event("ping"))

    def delta(self, delta: dict[str, Any]) -> None:
        self.out.append(event("content_block_delta", index=self.index, delta=delta))

    def close(self) -> None:
        if self.kind is None:
            return
        if self.kind == "thinking":
            self.delta({"type": "signature_delta", "signature": signature(self.thinking)})
            self.thinking = ""
        self.out.append(event("content_block_stop", index=self.index))
        self.kind = None

    def take(self) -> list[str]:
        taken, self.out = self.out, []
        return taken


@dataclass
class _Reply:
    """One streamed choice: engine text in, Anthropic events out."""

    reasoning: ReasoningSplitter | None
    tools: ToolCallStream | None
    blocks: _Blocks = field(default_factory=_Blocks)
    held: str = ""  # whitespace at the text's edges, held while the reply may still end in a tool call

    def _edges(self, text: str, flush: bool) -> tuple[str, str]:
        """(text to send, whitespace to hold): leading whitespace before the block opens, and trailing."""
        if flush:
            return text, ""
        body = text.rstrip()
        if self.blocks.kind != "text" and not body:
            return "", text
        return body, text[len(body):]

    def feed(self, text: str, final: bool) -> list[str]:
        thought, text = self.reasoning.feed(text, final) if self.reasoning is not None else ("", text)
        b = self.blocks
        if thought:
            if b.kind != "thinking":
                b.open({"type": "thinking", "thinking": "", "signature": ""})
            b.thinking += thought
            b.delta({"type": "thinking_delta", "thinking": thought})
        text, calls = self.tools.feed(text, final) if self.tools is not None else (text, [])
        if self.tools is not None:  # the whole reply's text is stripped when it has calls: hold the edges
            text, self.held = self._edges(self.held + text, final and not self.tools.called)
        if text:
            if b.kind != "text":
                b.open({"type": "text", "text": ""})
            b.delta({"type": "text_delta", "text": text})
        for d in calls:
            if "id" in d:
                b.open({"type": "tool_use", "id": tool_use_id(), "name": d["function"]["name"], "input": {}})
            else:
                b.delta({"type": "input_json_delta", "partial_json": d["function"]["arguments"]})
        return b.take()


async def message_events(
    header: MessageHeader, reasoning: str | None, fmt: ToolCallFormat | None, first: tuple[int, RequestOutput],
    outputs: AsyncIterator[tuple[int, RequestOutput]], usage: UsageTracker, breakpoint_tokens: int,
    on_done: Callable[[], None] = lambda: None,
) -> AsyncIterator[str]:
    """The events of one choice's outputs, `first` already read (it carries the cache hit)."""
    reply = _Reply(ReasoningSplitter(reasoning) if reasoning is not None else None,
                   ToolCallStream(fmt) if fmt is not None else None)

    try:
        usage.observe(*first)
        raise_if_failed(first[1])
        yield event("message_start", message=header.body([], None, None, Usage.of(usage, breakpoint_tokens)))
        last = first[1]
        for piece in reply.feed(last.new_text, last.finished):
            yield piece
        async for index, out in outputs:
            usage.observe(index, out)
            raise_if_failed(out)
            last = out
            for piece in reply.feed(out.new_text, out.finished):
                yield piece
        reply.blocks.close()
        if not reply.blocks.pinged:
            reply.blocks.out.append(event("ping"))
        for piece in reply.blocks.take():
            yield piece
        called = reply.tools is not None and reply.tools.called and reply.tools.parser.complete
        reason = stop_reason(last.finish_reason, last.stop_string, called)
        yield event("message_delta", delta={"stop_reason": reason,
                                            "stop_sequence": last.stop_string if reason == "stop_sequence" else None},
                    usage=Usage.of(usage, breakpoint_tokens).body())
        yield event("message_stop")
        on_done()
    except Exception as exc:  # noqa: BLE001 - reported in-band: the 200 status is already sent
        err = api_error_from(exc)
        status, body = anthropic_error(err.status_code, err.message, err.code)
        yield event("error", error=body["error"])
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]
