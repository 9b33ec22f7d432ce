"""A Responses API request, checked, and turned into the chat request the engine path runs.

Honoured: model, input (a string, or message / function_call / function_call_output items),
instructions, tools (function tools), tool_choice, parallel_tool_calls, max_output_tokens,
temperature, top_p, text.format (text / json_object / json_schema), stream, store,
previous_response_id, metadata, user, include ([]), truncation ('disabled'), and the cache fields
(prompt_cache_key, prompt_cache_retention, cache_salt) passed through to the chat request. Any
other field with a value, any other tool or item type, is a 400 naming it.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kvstrata.engine.sampling_params import InvalidRequestError
from kvstrata.serving.errors import QUOTE_CHARS, quote

PASSED_THROUGH = ("prompt_cache_key", "prompt_cache_retention", "cache_salt", "seed", "top_k", "stop")


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    include: list[str] | None = None
    truncation: str | None = None

    def refuse_unsupported(self) -> None:
        for name, value in (self.model_extra or {}).items():
            if value is not None and name not in PASSED_THROUGH:
                raise InvalidRequestError(f"{quote(name)} is not supported by /v1/responses here; omit it",
                                          name[:QUOTE_CHARS], "unsupported")
        if self.include:
            raise InvalidRequestError("include is not supported; send [] or omit it", "include", "unsupported")
        if self.truncation not in (None, "disabled"):
            raise InvalidRequestError("truncation may only be 'disabled'", "truncation", "unsupported")


def _text_of(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"{param} must be a string or a list of text parts", param)
    texts = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text") \
                or not isinstance(part.get("text"), str):
            raise InvalidRequestError(f"{param}[{k}] must be an input_text/output_text part", f"{param}[{k}]")
        texts.append(part["text"])
    return "\n".join(texts)


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items -> chat messages (consecutive function calls join one assistant message)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        param = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise InvalidRequestError(f"{param}.role must be user, assistant, system or developer", f"{param}.role")
            out.append({"role": role, "content": _text_of(item.get("content"), f"{param}.content")})
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise InvalidRequestError(f"{param} needs string call_id, name and arguments", param)
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str):
                raise InvalidRequestError(f"{param}.call_id must be a string", f"{param}.call_id")
            text = output if isinstance(output, str) else _text_of(output, f"{param}.output")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        else:
            raise InvalidRequestError(f"{param}.type {quote(kind)} is not supported; send message, function_call or "
                                      "function_call_output items", f"{param}.type")
    return out


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            msg = f"tools[{i}].type {quote(tool.get('type'))} is not supported; only function tools"
            raise InvalidRequestError(msg, f"tools[{i}].type", "unsupported")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def chat_response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise InvalidRequestError("text.format must be an object", "text.format")
    if fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):  # OpenAI's is required too (chat's json_schema defaults it)
            raise InvalidRequestError("text.format.schema is required for type json_schema: send the JSON schema",
                                      "text.format.schema")
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    return {"type": fmt.get("type")}


def chat_body(req: ResponsesRequest, history: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(chat request body, the conversation without instructions, to store for the next turn)."""
    conversation = history + input_messages(req.input)
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    body: dict[str, Any] = {
        "model": req.model, "messages": system + conversation, "tools": chat_tools(req.tools),
        "tool_choice": chat_tool_choice(req.tool_choice), "parallel_tool_calls": req.parallel_tool_calls,
        "max_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p,
        "response_format": chat_response_format(req.text), "user": req.user,
        **{k: v for k, v in (req.model_extra or {}).items() if k in PASSED_THROUGH and v is not None},
    }
    if not body["tools"]:
        if req.tool_choice not in (None, "none", "auto"):
            raise InvalidRequestError("tool_choice 'required' or a function needs tools; send them or omit tool_choice",
                                      "tool_choice")
        body.pop("tool_choice")
    return {k: v for k, v in body.items() if v is not None}, conversation
