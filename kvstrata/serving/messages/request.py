"""An Anthropic Messages API request, checked, and turned into the chat request the engine path runs.

Honoured: model, max_tokens, messages (text, tool_use, tool_result, thinking and redacted_thinking
blocks; `system` messages too, text only, as Claude Code sends them), system (a string or text blocks), tools (custom tools with input_schema), tool_choice
(auto / any / tool / none, disable_parallel_tool_use), stop_sequences, temperature, top_p, top_k,
metadata.user_id, stream, thinking (enabled / adaptive / disabled) and cache_control on blocks and
tools (cache_hints.py), and `seed` (ours: reproducible sampling, as on the chat route). Accepted and ignored, as a local model cannot honour them: `ACCEPTED_IGNORED`
(Claude Code sends context_management, output_config, service_tier...), and server tools (a `type`
other than "custom": web search, code execution, ...), which are dropped from the prompt rather than
refused, so a client that offers them still works. Image and document blocks, and any other field
with a value, are a 400 naming them.

`thinking` absent leaves the chat template's default (Qwen3 thinks); `{"type": "disabled"}` turns it
off with `enable_thinking: false`, the switch Qwen3-style templates read.
"""
from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kvstrata.engine.sampling_params import InvalidRequestError
from kvstrata.serving.errors import QUOTE_CHARS, quote

ACCEPTED_IGNORED = ("context_management", "output_config", "service_tier", "container", "mcp_servers",
                    "betas", "inference_geo", "diagnostics", "speed", "user_profile_id", "workspace_id")
PASSED_THROUGH = ("seed",)  # ours, not Anthropic's: a seeded sample is reproducible, as on the chat route
MAX_TEMPERATURE = 1.0  # Anthropic's range is [0, 1]
_TEXT_BLOCKS = ("text",)
_REFUSED_BLOCKS = ("image", "document", "search_result", "container_upload")


class MessagesRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    model: str | None = None
    max_tokens: int = Field(gt=0)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    metadata: dict[str, Any] | None = None
    stream: bool = False
    thinking: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None  # automatic caching: a breakpoint after the last block

    def refuse_unsupported(self) -> None:
        for name, value in (self.model_extra or {}).items():
            if value is not None and name not in ACCEPTED_IGNORED + PASSED_THROUGH:
                raise InvalidRequestError(f"{quote(name)} is not supported by /v1/messages here; omit it",
                                          name[:QUOTE_CHARS], "unsupported")
        if self.temperature is not None and self.temperature > MAX_TEMPERATURE:
            raise InvalidRequestError(f"temperature must be between 0 and 1, got {self.temperature}", "temperature")
        kind = (self.thinking or {}).get("type")
        if self.thinking is not None and kind not in ("enabled", "disabled", "adaptive"):
            raise InvalidRequestError("thinking.type must be 'enabled', 'disabled' or 'adaptive'", "thinking.type")
        user = (self.metadata or {}).get("user_id")
        if user is not None and not isinstance(user, str):
            raise InvalidRequestError("metadata.user_id must be a string", "metadata.user_id")

    @property
    def thinking_enabled(self) -> bool | None:
        """True / False as the request asks; None: the template's default."""
        kind = (self.thinking or {}).get("type")
        return None if kind is None else kind != "disabled"


class CountTokensRequest(MessagesRequest):
    """/v1/messages/count_tokens: a Messages request without max_tokens (the count is the prompt's)."""

    max_tokens: int = Field(default=1, gt=0)


def _block_text(block: Any, param: str) -> str:
    if not isinstance(block, dict) or block.get("type") not in _TEXT_BLOCKS or not isinstance(block.get("text"), str):
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        if kind in _REFUSED_BLOCKS:
            raise InvalidRequestError(f"{param}: {kind} blocks are not supported by this text-only model; send text",
                                      param, "unsupported")
        raise InvalidRequestError(f"{param} must be a text block, got {quote(kind)}", param)
    return str(block["text"])


def system_text(system: str | list[dict[str, Any]] | None) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    return "\n".join(_block_text(b, f"system[{k}]") for k, b in enumerate(system)) or None


def _tool_result_text(block: dict[str, Any], param: str) -> str:
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "\n".join(_block_text(b, f"{param}.content[{k}]") for k, b in enumerate(content))
    else:
        raise InvalidRequestError(f"{param}.content must be a string or a list of text blocks", f"{param}.content")
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise InvalidRequestError(f"{param}.is_error must be a boolean", f"{param}.is_error")
    return f"Error: {text}" if is_error else text


def _user_messages(content: list[Any], param: str) -> list[dict[str, Any]]:
    """A user turn's blocks in order: tool results become tool messages, runs of text a user message."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for k, block in enumerate(content):
        where = f"{param}[{k}]"
        if isinstance(block, dict) and block.get("type") == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise InvalidRequestError(f"{where}.tool_use_id must be a string", f"{where}.tool_use_id")
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                        "content": _tool_result_text(block, where)})
        else:
            texts.append(_block_text(block, where))
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant_message(content: list[Any], param: str) -> dict[str, Any]:
    texts, calls, thinking = [], [], []
    for k, block in enumerate(content):
        where = f"{param}[{k}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) \
                    or not isinstance(block.get("input"), dict):
                raise InvalidRequestError(f"{where} needs a string id and name and an object input", where)
            calls.append({"id": block["id"], "type": "function", "function": {
                "name": block["name"], "arguments": json.dumps(block["input"], ensure_ascii=False)}})
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise InvalidRequestError(f"{where}.thinking must be a string", f"{where}.thinking")
            thinking.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue  # opaque to us: nothing the template could show
        else:
            texts.append(_block_text(block, where))
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "\n".join(thinking)
    return message


def chat_messages(req: MessagesRequest) -> tuple[list[dict[str, Any]], list[int]]:
    """(the conversation as chat messages, system first; the count of chat messages once each of
    `req.messages` is in, for cache_control breakpoints)."""
    system = system_text(req.system)
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    ends: list[int] = []
    for i, message in enumerate(req.messages):
        _append_message(out, message, f"messages[{i}]")
        ends.append(len(out))
    return out, ends


def _append_message(out: list[dict[str, Any]], message: Any, param: str) -> None:
    """One Anthropic message as chat messages (a user turn with tool results becomes several)."""
    if not isinstance(message, dict):
        raise InvalidRequestError(f"{param} must be an object with role and content", param)
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant", "system"):
        raise InvalidRequestError(f"{param}.role must be 'user', 'assistant' or 'system'", f"{param}.role")
    if role == "system":  # Claude Code sends mid-conversation system messages (text only)
        if not isinstance(content, (str, list)):
            raise InvalidRequestError(f"{param}.content must be a string or text blocks", f"{param}.content")
        out.append({"role": "system", "content": system_text(content) or ""})
    elif isinstance(content, str):
        out.append({"role": role, "content": content})
    elif not isinstance(content, list):
        raise InvalidRequestError(f"{param}.content must be a string or a list of content blocks", f"{param}.content")
    elif role == "user":
        out.extend(_user_messages(content, f"{param}.content"))
    else:
        out.append(_assistant_message(content, f"{param}.content"))


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Custom tools as chat function tools; server tools (a `type` of their own) are dropped."""
    out = []
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, dict):
            raise InvalidRequestError(f"tools[{i}] must be an object", f"tools[{i}]")
        if tool.get("type") not in (None, "custom"):
            continue
        if not isinstance(tool.get("name"), str) or not isinstance(tool.get("input_schema"), dict):
            raise InvalidRequestError(f"tools[{i}] needs a string name and an input_schema object", f"tools[{i}]")
        fn = {"name": tool["name"], "parameters": tool["input_schema"]}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out or None


def chat_tool_choice(choice: dict[str, Any] | None, has_tools: bool) -> tuple[Any, bool | None]:
    """(chat tool_choice, parallel_tool_calls) of an Anthropic tool_choice."""
    if choice is None:
        return None, None
    kind = choice.get("type")
    parallel = None if choice.get("disable_parallel_tool_use") is None else not choice["disable_parallel_tool_use"]
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise InvalidRequestError("tool_choice.name must name a tool for type 'tool'", "tool_choice.name")
        chat: Any = {"type": "function", "function": {"name": choice["name"]}}
    elif kind in ("auto", "any", "none"):
        chat = {"auto": "auto", "any": "required", "none": "none"}[kind]
    else:
        raise InvalidRequestError("tool_choice.type must be 'auto', 'any', 'tool' or 'none'", "tool_choice.type")
    if not has_tools and chat not in ("auto", "none"):
        raise InvalidRequestError(f"tool_choice {quote(kind)} needs tools; send them or omit tool_choice", "tool_choice")
    return (chat if has_tools else None), parallel


def chat_body(req: MessagesRequest, session: str | None) -> tuple[dict[str, Any], list[int]]:
    """(the chat request body this Messages request runs as, `chat_messages`' ends); `session` becomes
    its prompt_cache_key."""
    messages, ends = chat_messages(req)
    tools = chat_tools(req.tools)
    tool_choice, parallel = chat_tool_choice(req.tool_choice, tools is not None)
    body: dict[str, Any] = {
        "model": req.model, "messages": messages, "tools": tools, "tool_choice": tool_choice,
        "parallel_tool_calls": parallel, "max_tokens": req.max_tokens, "temperature": req.temperature,
        "top_p": req.top_p, "top_k": req.top_k, "stop": req.stop_sequences or None, "prompt_cache_key": session,
        **{k: v for k, v in (req.model_extra or {}).items() if k in PASSED_THROUGH},
    }
    if req.thinking_enabled is False:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    return {k: v for k, v in body.items() if v is not None}, ends
