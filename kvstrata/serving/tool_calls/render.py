"""Conversations with tools, as the chat template sees them.

A template with tool syntax (it reads `tools`) gets the tools and the calls as transformers
passes them (arguments as objects, as vLLM does). A template without any (SmolLM2's) gets them
written into the prompt: the tool list and how to call them at the end of the system message,
and each earlier call as the assistant's text, in the same spelling the model was constrained
to, so turn N+1's prompt starts with turn N's prompt and reply (the prefix cache hits).
"""
from __future__ import annotations

import json
from typing import Any

from kvstrata.serving.tool_calls.formats import ToolCallFormat

TOOLS_HEADER = "You can call these tools (JSON schemas):"


def tools_system_text(fmt: ToolCallFormat, tools: list[dict[str, Any]]) -> str:
    lines = [json.dumps(t["function"], ensure_ascii=False, sort_keys=True) for t in tools]
    example = fmt.render_call("<tool name>", "{<arguments>}")
    return f"{TOOLS_HEADER}\n" + "\n".join(lines) + f"\nTo call a tool, answer with only: {example}"


def calls_text(fmt: ToolCallFormat, calls: list[dict[str, Any]]) -> str:
    rendered = [fmt.render_call(c["function"]["name"], c["function"].get("arguments") or "{}") for c in calls]
    return fmt.lead + fmt.separator.join(rendered)


def _with_object_arguments(message: dict[str, Any]) -> dict[str, Any]:
    calls = []
    for call in message["tool_calls"]:
        fn = dict(call["function"])
        if isinstance(fn.get("arguments"), str):
            fn["arguments"] = json.loads(fn["arguments"] or "{}")
        calls.append({**call, "function": fn, **fn})  # some templates read call.name, others call.function.name
    return {**message, "tool_calls": calls}


def messages_for_template(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, fmt: ToolCallFormat, template_has_tools: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) to hand the chat template."""
    if template_has_tools:
        return [_with_object_arguments(m) if m.get("tool_calls") else m for m in messages], tools
    out = []
    for m in messages:
        if m.get("tool_calls"):
            text = calls_text(fmt, m["tool_calls"])
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            m["content"] = f"{m['content']}\n{text}" if m.get("content") else text
        out.append(m)
    if tools:
        system = tools_system_text(fmt, tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{system}"}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out, None
