"""What /v1/messages answers: content blocks, stop_reason, usage in Anthropic's meaning, the message.

A reply is read in three layers, the same whole or streamed: the reasoning parser splits off the
model's thinking (a `thinking` block), the tool-call parser reads the rest for calls (`tool_use`
blocks, ids `toolu_...`, input parsed from the argument text), and what is left is a `text` block.

Usage: Anthropic counts a prompt in three disjoint parts: `cache_read_input_tokens` (read from the
prefix cache), `cache_creation_input_tokens` (written to the cache at the request's cache_control
breakpoints: the tokens up to the last breakpoint that were not read) and `input_tokens` (the rest).
"""
from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from kvstrata.serving.reasoning import split_reasoning
from kvstrata.serving.responses.output import split_reply
from kvstrata.serving.streaming import UsageTracker
from kvstrata.serving.tool_calls.formats import ToolCallFormat


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def signature(thinking: str) -> str:
    """A thinking block's signature: a digest of its text (clients send it back; we need no secret,
    the text itself is what the next prompt renders)."""
    return hashlib.sha256(thinking.encode()).hexdigest()[:32]


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's argument text as the `input` object (text that is not an object is kept under `raw`)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return {"raw": arguments}
    return value if isinstance(value, dict) else {"raw": arguments}


def stop_reason(engine_reason: str | None, stop_string: str | None, called: bool) -> str | None:
    """Anthropic's stop_reason of a finished reply."""
    if engine_reason is None:
        return None
    if called:
        return "tool_use"
    if engine_reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop_string is not None else "end_turn"


@dataclass(frozen=True)
class Usage:
    """A request's token counts, split as Anthropic counts them."""

    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    breakpoint_tokens: int = 0  # the prompt's tokens up to its last cache_control breakpoint

    @classmethod
    def of(cls, tracker: UsageTracker, breakpoint_tokens: int) -> Usage:
        """A one-choice request's counts so far, from the tracker the routes keep."""
        body = tracker.body()
        return cls(body["prompt_tokens"], body["prompt_tokens_details"]["cached_tokens"], body["completion_tokens"],
                   breakpoint_tokens)

    def body(self) -> dict[str, int]:
        read = min(self.cached_tokens, self.prompt_tokens)
        created = max(0, min(self.breakpoint_tokens, self.prompt_tokens) - read)
        return {
            "input_tokens": self.prompt_tokens - read - created,
            "cache_creation_input_tokens": created,
            "cache_read_input_tokens": read,
            "output_tokens": self.output_tokens,
        }


def reply_blocks(reasoning: str | None, fmt: ToolCallFormat | None, text: str) -> tuple[list[dict[str, Any]], bool]:
    """(content blocks, whether the reply ended with whole tool calls) of a finished reply."""
    thinking, rest = split_reasoning(reasoning, text)
    content, calls, complete = split_reply(fmt, rest)
    blocks: list[dict[str, Any]] = []
    if thinking:
        blocks.append({"type": "thinking", "thinking": thinking, "signature": signature(thinking)})
    if content:
        blocks.append({"type": "text", "text": content})
    blocks += [{"type": "tool_use", "id": tool_use_id(), "name": name, "input": tool_input(args)}
               for name, args in calls]
    return blocks, bool(calls) and complete


@dataclass(frozen=True)
class MessageHeader:
    """The fields of a message that do not depend on its content."""

    model: str
    message_id: str = field(default_factory=message_id)
    created: float = field(default_factory=time.time)

    def body(self, content: list[dict[str, Any]], reason: str | None, stop_string: str | None,
             usage: Usage) -> dict[str, Any]:
        return {
            "id": self.message_id, "type": "message", "role": "assistant", "model": self.model, "content": content,
            "stop_reason": reason, "stop_sequence": stop_string if reason == "stop_sequence" else None,
            "usage": usage.body(),
        }
