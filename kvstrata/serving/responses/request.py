"""A Responses API request, checked, and turned into the chat request the engine path runs.

Honoured: model, input (a string, or message / function_call / function_call_output / reasoning
items), instructions, tools (tools.py: function and namespace tools; hosted tools dropped),
tool_choice, parallel_tool_calls, max_output_tokens, temperature, top_p, text.format (text /
json_object / json_schema), stream, store, previous_response_id, metadata, user, truncation
('disabled'), and the cache fields (prompt_cache_key, prompt_cache_retention, cache_salt) passed
through to the chat request. reasoning.effort reaches the chat template as `reasoning_effort`;
"none" and "minimal" turn thinking off (`enable_thinking: false`). include may hold
"reasoning.encrypted_content" (reasoning_items.py) and "message.output_text.logprobs" (with `top_logprobs`,
0-20: the message's tokens' logprobs, route.py; not with tools, whose calls' tokens would mix in).

Accepted and ignored, for what a local model cannot honour (Codex sends them): reasoning.summary
(no summariser runs: `summary` stays []), reasoning.context, text.verbosity, service_tier,
client_metadata, and Codex's `additional_tools` input items are read for their tools only.
Any other field with a value, any other tool or item type, is a 400 naming it.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kvstrata.engine.sampling_params import InvalidRequestError
from kvstrata.serving.errors import QUOTE_CHARS, quote
from kvstrata.serving.responses.reasoning_items import ENCRYPTED_CONTENT, input_reasoning
from kvstrata.serving.responses.tools import chat_name, chat_tool_choice, request_tools

OUTPUT_LOGPROBS = "message.output_text.logprobs"
INCLUDABLE = (ENCRYPTED_CONTENT, OUTPUT_LOGPROBS)
PASSED_THROUGH = ("prompt_cache_key", "prompt_cache_retention", "cache_salt", "seed", "top_k", "stop", "priority")
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
THINKING_OFF = ("none", "minimal")
# field -> its keys we accept, and each key's allowed values (None: any, checked where it is used)
_KEYS: dict[str, dict[str, tuple[str, ...] | None]] = {
    "reasoning": {"effort": EFFORTS, "summary": ("auto", "concise", "detailed"),
                  "generate_summary": ("auto", "concise", "detailed"), "context": None},
    "text": {"format": None, "verbosity": ("low", "medium", "high")},
}
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")


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
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    truncation: str | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: str | None = None  # ignored: one tier here
    client_metadata: dict[str, Any] | None = None  # ignored (Codex's session and turn ids)

    def refuse_unsupported(self) -> None:
        for name, value in (self.model_extra or {}).items():
            if value is not None and name not in PASSED_THROUGH:
                raise InvalidRequestError(f"{quote(name)} is not supported by /v1/responses here; omit it",
                                          name[:QUOTE_CHARS], "unsupported")
        for value in self.include or []:
            if value not in INCLUDABLE:
                raise InvalidRequestError(f"include {quote(value)} is not supported; only {list(INCLUDABLE)}",
                                          "include", "unsupported")
        if self.logprobs and self.tools:
            raise InvalidRequestError(f"include {OUTPUT_LOGPROBS!r} is not supported with tools here; omit one",
                                      "include", "unsupported")
        if self.truncation not in (None, "disabled"):
            raise InvalidRequestError("truncation may only be 'disabled'", "truncation", "unsupported")
        if self.service_tier not in (None, *SERVICE_TIERS):
            raise InvalidRequestError(f"service_tier must be one of {SERVICE_TIERS}", "service_tier")
        for name, keys in _KEYS.items():
            for key, value in (getattr(self, name) or {}).items():
                param = f"{name}.{key}"[:QUOTE_CHARS]
                if key not in keys:
                    raise InvalidRequestError(f"{quote(param)} is not supported here; omit it", param, "unsupported")
                allowed = keys[key]
                if allowed is not None and value is not None and value not in allowed:
                    raise InvalidRequestError(f"{param} must be one of {allowed}, got {quote(value)}", param)

    @property
    def effort(self) -> str | None:
        return (self.reasoning or {}).get("effort")

    @property
    def logprobs(self) -> bool:
        """Whether the message's text carries its tokens' logprobs (include: message.output_text.logprobs)."""
        return OUTPUT_LOGPROBS in (self.include or [])

    @property
    def encrypted_reasoning(self) -> bool:
        """Whether reasoning items carry `encrypted_content` (include: reasoning.encrypted_content)."""
        return ENCRYPTED_CONTENT in (self.include or [])


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


def _assistant(out: list[dict[str, Any]], reasoning: str | None, calls: bool) -> dict[str, Any]:
    """The assistant message the next item belongs to: for a call with no reasoning item before it,
    the assistant message just before (one reply's text and calls are one message, as the model wrote
    them and as a stored reply is kept); else a new one (carrying `reasoning`)."""
    if calls and reasoning is None and out and out[-1]["role"] == "assistant":
        return out[-1]
    message: dict[str, Any] = {"role": "assistant", "content": None if calls else ""}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    out.append(message)
    return message


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items -> chat messages (an assistant message and the function calls right after it are
    one assistant message; a reasoning item's text goes with the assistant message after it)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    reasoning: str | None = None  # of a reasoning item not yet given to an assistant message
    for i, item in enumerate(items):
        param = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "reasoning":
            text = input_reasoning(item, param)
            if text is not None:
                reasoning = text if reasoning is None else reasoning + text
            continue
        if kind == "additional_tools":
            continue  # its tools are read with `tools` (tools.py)
        role = item.get("role") if kind == "message" else "assistant" if kind == "function_call" else None
        if reasoning is not None and role != "assistant":
            _assistant(out, reasoning, calls=False)  # reasoning with no reply after it
            reasoning = None
        if kind == "message":
            if role not in ("user", "assistant", "system", "developer"):
                raise InvalidRequestError(f"{param}.role must be user, assistant, system or developer", f"{param}.role")
            text = _text_of(item.get("content"), f"{param}.content")
            if role == "assistant":
                _assistant(out, reasoning, calls=False)["content"] = text
            else:
                out.append({"role": role, "content": text})
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise InvalidRequestError(f"{param} needs string call_id, name and arguments", param)
            namespace = item.get("namespace")
            if namespace is not None and not isinstance(namespace, str):
                raise InvalidRequestError(f"{param}.namespace must be a string", f"{param}.namespace")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": chat_name(namespace, item["name"]), "arguments": item["arguments"]}}
            _assistant(out, reasoning, calls=True).setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str):
                raise InvalidRequestError(f"{param}.call_id must be a string", f"{param}.call_id")
            text = output if isinstance(output, str) else _text_of(output, f"{param}.output")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        else:
            raise InvalidRequestError(f"{param}.type {quote(kind)} is not supported; send message, function_call, "
                                      "function_call_output or reasoning items", f"{param}.type")
        if role == "assistant":
            reasoning = None
    if reasoning is not None:
        _assistant(out, reasoning, calls=False)
    return out


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
    tools = request_tools(req.tools, req.input).tools or None
    body: dict[str, Any] = {
        "model": req.model, "messages": system + conversation, "tools": tools,
        "tool_choice": chat_tool_choice(req.tool_choice), "parallel_tool_calls": req.parallel_tool_calls,
        "max_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p,
        "response_format": chat_response_format(req.text), "user": req.user, "reasoning_effort": req.effort,
        "chat_template_kwargs": {"enable_thinking": False} if req.effort in THINKING_OFF else None,
        "logprobs": True if req.logprobs else None, "top_logprobs": (req.top_logprobs or 0) if req.logprobs else None,
        **{k: v for k, v in (req.model_extra or {}).items() if k in PASSED_THROUGH and v is not None},
    }
    if not body["tools"]:
        if req.tool_choice not in (None, "none", "auto"):
            raise InvalidRequestError("tool_choice 'required' or a function needs tools; send them or omit tool_choice",
                                      "tool_choice")
        body.pop("tool_choice")
    return {k: v for k, v in body.items() if v is not None}, conversation
