"""What /v1/responses answers: output items, the response object, and its stream of events.

Items: a `message` (one `output_text` part) for content, a `function_call` (call_id, name, raw
argument text) per tool call. Streamed, the events are OpenAI's: response.created /
in_progress, output_item.added, content_part.added, output_text.delta ... done,
function_call_arguments.delta ... done, output_item.done, response.completed; each with a
sequence_number.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from kvstrata.serving.tool_calls.formats import ToolCallFormat
from kvstrata.serving.tool_calls.output import whole_reply


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    parts = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": parts}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def split_reply(fmt: ToolCallFormat | None, text: str) -> tuple[str, list[tuple[str, str]], bool]:
    """(content, [(name, arguments)], whether every call is whole) of a finished reply, read as
    its stream is (tool_calls/parser.py)."""
    if fmt is None:
        return text, [], False
    content, calls, complete = whole_reply(fmt, text)
    if not calls:
        return content, [], False
    return content.strip(), [(c.name, c.arguments) for c in calls], complete


def output_items(content: str, calls: list[tuple[str, str]]) -> list[dict[str, Any]]:
    items = [message_item(new_id("msg"), content)] if content or not calls else []
    return items + [call_item(new_id("fc"), new_id("call"), name, args) for name, args in calls]


def conversation_turn(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant chat message these output items are, for the next turn's prompt."""
    text = "".join(p["text"] for i in items if i["type"] == "message" for p in i["content"])
    calls = [{"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
             for i in items if i["type"] == "function_call"]
    return {"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})}


@dataclass
class ResponseHeader:
    """The fields of a response object that do not depend on its output."""

    response_id: str
    model: str
    request: dict[str, Any]  # echoed fields: instructions, tools, tool_choice, ...
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(self, status: str, items: list[dict[str, Any]], usage: dict[str, Any] | None,
             finish_reason: str | None = None) -> dict[str, Any]:
        r = self.request
        incomplete = {"reason": "max_output_tokens"} if finish_reason == "length" else None
        return {
            "id": self.response_id, "object": "response", "created_at": self.created_at,
            "status": "incomplete" if incomplete and status == "completed" else status,
            "model": self.model, "output": items, "error": None, "incomplete_details": incomplete,
            "instructions": r.get("instructions"), "max_output_tokens": r.get("max_output_tokens"),
            "metadata": r.get("metadata") or {}, "parallel_tool_calls": r.get("parallel_tool_calls", True) is not False,
            "previous_response_id": r.get("previous_response_id"), "temperature": r.get("temperature"),
            "top_p": r.get("top_p"), "tool_choice": r.get("tool_choice") or "auto", "tools": r.get("tools") or [],
            "text": r.get("text") or {"format": {"type": "text"}}, "truncation": "disabled",
            "store": r.get("store", True), "usage": usage,
            "prompt_cache_key": r.get("prompt_cache_key"),
        }


def responses_usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": chat_usage["prompt_tokens_details"]["cached_tokens"]},
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage["total_tokens"],
    }
