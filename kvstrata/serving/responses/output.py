"""What /v1/responses answers: output items, the response object, and its stream of events.

Items, in this order: a `reasoning` item for the reply's reasoning (reasoning_items.py), a `message`
(one `output_text` part) for content, a `function_call` (call_id, name, raw argument text; and
`namespace` for a namespaced tool, tools.py) per tool call. Streamed, the events are OpenAI's:
response.created / in_progress, output_item.added, reasoning_text.delta ... done,
content_part.added, output_text.delta ... done, function_call_arguments.delta ... done,
output_item.done, response.completed; each with a sequence_number.

usage.output_tokens_details.reasoning_tokens: the tokens sampled while the reply was in its reasoning
(each engine output's tokens counted by where the splitter was after it; an output that crosses
`</think>`, as a speculative step's can, counts on the side it ends on).
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from kvstrata.serving.logprob_shapes import TokenText
from kvstrata.serving.responses.reasoning_items import reasoning_item
from kvstrata.serving.responses.tools import ToolSet, chat_name
from kvstrata.serving.tool_calls.formats import ToolCallFormat
from kvstrata.serving.tool_calls.output import whole_reply


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str, status: str = "completed",
                 logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """`logprobs`: the text's tokens' (serving/logprob_shapes.py's chat entries), when asked for."""
    parts = [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}] \
        if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": parts}


def call_item(item_id: str, call_id: str, name: tuple[str | None, str], arguments: str,
              status: str = "completed") -> dict[str, Any]:
    """`name`: (namespace, name) as the client wrote the tool (ToolSet.output_name)."""
    namespace, own = name
    item = {"type": "function_call", "id": item_id, "call_id": call_id, "name": own, "arguments": arguments,
            "status": status}
    return item if namespace is None else {**item, "namespace": namespace}


@dataclass(frozen=True)
class OutputPlan:
    """How one request's reply becomes output items."""

    tool_format: ToolCallFormat | None  # None: the reply is not read for calls
    reasoning: str | None  # the reasoning parser (serving/reasoning.py); None: no reasoning item
    tools: ToolSet  # call names back to (namespace, name)
    encrypted: bool  # reasoning items carry encrypted_content
    token_text: TokenText | None = None  # the message's text carries logprobs: a token's text


def split_reply(fmt: ToolCallFormat | None, text: str) -> tuple[str, list[tuple[str, str]], bool]:
    """(content, [(name, arguments)], whether every call is whole) of a finished reply, read as
    its stream is (tool_calls/parser.py)."""
    if fmt is None:
        return text, [], False
    content, calls, complete = whole_reply(fmt, text)
    if not calls:
        return content, [], False
    return content.strip(), [(c.name, c.arguments) for c in calls], complete


def output_items(plan: OutputPlan, reasoning: str | None, content: str,
                 calls: list[tuple[str, str]], logprobs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    items = [reasoning_item(new_id("rs"), reasoning, plan.encrypted)] if reasoning is not None else []
    items += [message_item(new_id("msg"), content, logprobs=logprobs)] if content or not (calls or items) else []
    return items + [call_item(new_id("fc"), new_id("call"), plan.tools.output_name(name), args) for name, args in calls]


def conversation_turn(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant chat message these output items are, for the next turn's prompt."""
    text = "".join(p["text"] for i in items if i["type"] == "message" for p in i["content"])
    reasoning = "".join(p["text"] for i in items if i["type"] == "reasoning" for p in i["content"])
    calls = [{"id": i["call_id"], "type": "function",
              "function": {"name": chat_name(i.get("namespace"), i["name"]), "arguments": i["arguments"]}}
             for i in items if i["type"] == "function_call"]
    turn: dict[str, Any] = {"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})}
    if any(i["type"] == "reasoning" for i in items):
        turn["reasoning_content"] = reasoning
    if turn["content"] is None and not calls:
        turn["content"] = ""
    return turn


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
            "prompt_cache_key": r.get("prompt_cache_key"), "reasoning": r.get("reasoning"),
        }


def responses_usage(chat_usage: dict[str, Any], reasoning_tokens: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": chat_usage["prompt_tokens_details"]["cached_tokens"]},
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": chat_usage["total_tokens"],
    }
